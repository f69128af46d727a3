# One LibTorch, linked with its own dependencies (docs/building.md#which-libtorch).
#
# curv_prefer_torch_prefix() runs before find_package(Torch): TorchConfig.cmake looks its
# libraries up with find_library, which searches the system's folders before its own, so a
# prefix path naming only a torch wheel's CMake folder (torch/share/cmake) would pick Debian's
# libc10.so and libtorch.so beside the wheel's headers. The install's own root is added to the
# prefix path, whose lib/ comes before the system's.
#
# curv_check_torch_linking() runs after it:
# - every torch library must come from the install TorchConfig.cmake belongs to, else configure
#   stops naming both paths;
# - LibTorch's own dependencies (NCCL, cuBLAS, cuDNN, ...) resolve, at link time, from the
#   folders the install ships them in (a wheel's nvidia/*/lib, an archive's lib/) before any
#   other copy on the machine, such as the CUDA toolkit's older NCCL: -rpath-link puts
#   CURV_TORCH_LIBRARY_DIRS first. At run time LibTorch's own RPATHs find the same copies, and
#   libcurv's CUDA kernels link LibTorch's CUDA runtime (CURV_TORCH_CUDART) where it ships one;
# - a tiny program linked against LibTorch at configure time turns a page of undefined
#   references into one line naming the library, the copies found and the setting that picks one.

function(curv_prefer_torch_prefix)
  set(roots "")
  set(candidates ${CMAKE_PREFIX_PATH})
  if(Torch_DIR)
    list(APPEND candidates "${Torch_DIR}/../..")
  endif()
  foreach(dir ${candidates})
    # torch/share/cmake (a wheel's torch.utils.cmake_prefix_path) or a LibTorch root.
    if(EXISTS "${dir}/Torch/TorchConfig.cmake")
      get_filename_component(root "${dir}/../.." REALPATH)
      if(EXISTS "${root}/lib" AND NOT root IN_LIST CMAKE_PREFIX_PATH)
        list(APPEND roots "${root}")
      endif()
    endif()
  endforeach()
  if(roots)
    set(CMAKE_PREFIX_PATH ${CMAKE_PREFIX_PATH} ${roots} PARENT_SCOPE)
  endif()
endfunction()

# The folders that hold a copy of the shared library `soname` among `dirs`.
function(curv_copies_of soname dirs out)
  set(found "")
  foreach(dir ${dirs})
    if(EXISTS "${dir}/${soname}")
      get_filename_component(real "${dir}/${soname}" REALPATH)
      list(APPEND found "${real}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES found)
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# The files `items` (targets, paths, flags) link, targets flattened through their imported
# locations and link interfaces: what try_compile can link without the targets themselves.
function(curv_link_files items out)
  set(files "")
  set(queue ${items})
  set(seen "")
  while(queue)
    list(POP_FRONT queue item)
    if(item IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${item}")
    if(TARGET "${item}")
      foreach(prop IMPORTED_LOCATION IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_NOCONFIG)
        get_target_property(loc "${item}" ${prop})
        if(loc)
          list(APPEND files "${loc}")
          break()
        endif()
      endforeach()
      get_target_property(deps "${item}" INTERFACE_LINK_LIBRARIES)
      if(deps)
        list(APPEND queue ${deps})
      endif()
    elseif(IS_ABSOLUTE "${item}" AND EXISTS "${item}")
      list(APPEND files "${item}")
    elseif(item MATCHES "^-Wl,--no-as-needed,(.+)$" AND EXISTS "${CMAKE_MATCH_1}")
      list(APPEND files "${CMAKE_MATCH_1}")
    endif()
  endwhile()
  list(REMOVE_DUPLICATES files)
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

function(curv_check_torch_linking)
  get_filename_component(root "${TORCH_INSTALL_PREFIX}" REALPATH)
  # 1. One LibTorch.
  foreach(var TORCH_LIBRARY c10_LIBRARY C10_CUDA_LIBRARY)
    if(${var} AND EXISTS "${${var}}")
      get_filename_component(lib "${${var}}" REALPATH)
      string(FIND "${lib}" "${root}/" at)
      if(NOT at EQUAL 0)
        message(FATAL_ERROR
                "two LibTorch installs: ${${var}} (${var}) is not from ${root}, whose "
                "TorchConfig.cmake was found; configure a fresh build folder with "
                "-DCMAKE_PREFIX_PATH=\"${root}/share/cmake;${root}\" (or -DCMAKE_PREFIX_PATH=${root} "
                "for a LibTorch archive)")
      endif()
    endif()
  endforeach()

  # 2. LibTorch's dependencies from its own folders, first.
  file(GLOB wheel_dirs LIST_DIRECTORIES true "${root}/../nvidia/*/lib")
  set(CURV_TORCH_LIBRARY_DIRS "${root}/lib;${wheel_dirs}" CACHE STRING
      "Folders searched first, at link time, for LibTorch's own dependencies (NCCL, cuBLAS, cuDNN, ...): by default the LibTorch install's lib/ and a torch wheel's nvidia/*/lib")
  foreach(dir ${CURV_TORCH_LIBRARY_DIRS})
    add_link_options("LINKER:-rpath-link,${dir}")
  endforeach()
  # The programs' run-time search path starts with the same folders: a library that libcurv or a
  # program needs directly (the CUDA runtime of libcurv's kernels, the NVRTC TorchConfig adds)
  # loads from the install, not from the toolkit's folder CMake also lists, and LibTorch then
  # finds it already loaded. System folders (Debian's LibTorch) are left out.
  set(rpath "")
  foreach(dir ${CURV_TORCH_LIBRARY_DIRS})
    if(NOT dir MATCHES "^/usr/lib" AND NOT dir MATCHES "^/lib")
      list(APPEND rpath "${dir}")
    endif()
  endforeach()
  set(CMAKE_BUILD_RPATH ${rpath} ${CMAKE_BUILD_RPATH} PARENT_SCOPE)
  # The installed libcurv and tools keep them (find_package(curv) programs load the same copies).
  set(CMAKE_INSTALL_RPATH ${rpath} ${CMAKE_INSTALL_RPATH} PARENT_SCOPE)
  # The CUDA runtime libcurv's own kernels link: the one LibTorch loads (a wheel ships it in
  # nvidia/*/lib), so that one process holds one copy; else the toolkit's (CUDA::cudart).
  set(cudart "")
  foreach(dir ${CURV_TORCH_LIBRARY_DIRS})
    file(GLOB found "${dir}/libcudart.so.[0-9]*")
    if(found AND NOT cudart)
      list(GET found 0 cudart)
    endif()
  endforeach()
  set(CURV_TORCH_CUDART "${cudart}" PARENT_SCOPE)
  set(CURV_TORCH_LINK_OPTIONS "")
  foreach(dir ${CURV_TORCH_LIBRARY_DIRS})
    list(APPEND CURV_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${dir}")
  endforeach()

  # 3. A program linked against LibTorch, once per configuration of the same install.
  if(CURV_TORCH_LINK_CHECKED STREQUAL "${root};${CURV_TORCH_LIBRARY_DIRS}")
    return()
  endif()
  curv_link_files("${TORCH_LIBRARIES}" link_files)
  set(source "${CMAKE_BINARY_DIR}/CMakeFiles/curv_torch_link_check.cpp")
  file(WRITE "${source}" "int main() { return 0; }\n")
  try_compile(linked "${CMAKE_BINARY_DIR}/CMakeFiles/curv_torch_link_check"
              SOURCES "${source}"
              LINK_LIBRARIES ${link_files}
              LINK_OPTIONS "LINKER:--no-as-needed" ${CURV_TORCH_LINK_OPTIONS}
              OUTPUT_VARIABLE output)
  if(linked)
    set(CURV_TORCH_LINK_CHECKED "${root};${CURV_TORCH_LIBRARY_DIRS}" CACHE INTERNAL "")
    message(STATUS "libcurv: LibTorch ${root} links, its dependencies from ${CURV_TORCH_LIBRARY_DIRS}")
    return()
  endif()
  string(REGEX MATCH "([^ /:]+\\.so[.0-9]*): undefined reference to `([^']+)'" hit "${output}")
  set(symbol "${CMAKE_MATCH_2}")
  set(from "${CMAKE_MATCH_1}")
  # The library a missing symbol belongs to, by the prefix NVIDIA's libraries give their API.
  set(soname "")
  foreach(pair "nccl:libnccl.so.2" "cublasLt:libcublasLt.so" "cublas:libcublas.so"
               "cudnn:libcudnn.so" "cusparseLt:libcusparseLt.so" "cusparse:libcusparse.so"
               "cufft:libcufft.so" "curand:libcurand.so" "cusolver:libcusolver.so"
               "nvshmem:libnvshmem" "cufile:libcufile.so" "cuda:libcudart.so")
    string(REPLACE ":" ";" pair "${pair}")
    list(GET pair 0 prefix)
    list(GET pair 1 name)
    if(soname STREQUAL "" AND symbol MATCHES "^${prefix}")
      set(soname "${name}")
    endif()
  endforeach()
  set(copies "")
  if(soname)
    file(GLOB system_dirs LIST_DIRECTORIES true /usr/local/cuda*/lib /usr/local/cuda*/lib64
         /usr/lib/x86_64-linux-gnu /usr/local/lib)
    file(GLOB_RECURSE all_copies "${root}/../nvidia/${soname}*")
    foreach(dir ${CURV_TORCH_LIBRARY_DIRS} ${system_dirs})
      file(GLOB here "${dir}/${soname}*")
      list(APPEND all_copies ${here})
    endforeach()
    foreach(copy ${all_copies})
      get_filename_component(copy "${copy}" REALPATH)
      get_filename_component(dir "${copy}" DIRECTORY)
      list(APPEND copies "${dir}")
    endforeach()
    list(REMOVE_DUPLICATES copies)
  endif()
  if(symbol)
    string(REPLACE ";" ", " copies_text "${copies}")
    message(FATAL_ERROR
            "LibTorch ${root} does not link: ${from} needs ${symbol}, missing from the "
            "${soname} the linker found first; copies in: ${copies_text}; set "
            "-DCURV_TORCH_LIBRARY_DIRS=<the folder of the copy LibTorch was built with> "
            "(searched first; now ${CURV_TORCH_LIBRARY_DIRS})")
  endif()
  message(FATAL_ERROR "LibTorch ${root}: a program linked against it does not build:\n${output}")
endfunction()

# curv_find_torch(): find_package(Torch), except for a CUDA build of LibTorch (the torch wheel
# from PyPI) on a machine without the CUDA toolkit, whose TorchConfig.cmake stops in Caffe2's
# cuda.cmake ("Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries").
# There the install is taken as a CPU LibTorch, as torch's own C++ extensions take it: its
# libraries (libtorch loads libtorch_cuda itself), headers and ABI flag, with no CUDA libraries,
# so libcurv builds without its CUDA kernels and CUDA tensors take the fused operations' ATen
# formulas. Sets what find_package(Torch) sets that the project reads.
macro(curv_find_torch)
  find_path(CURV_TORCH_CONFIG_DIR Torch/TorchConfig.cmake PATHS ${CMAKE_PREFIX_PATH}
            PATH_SUFFIXES share/cmake NO_DEFAULT_PATH)
  set(curv_cuda_build OFF)
  if(CURV_TORCH_CONFIG_DIR AND EXISTS "${CURV_TORCH_CONFIG_DIR}/Caffe2/Caffe2Config.cmake")
    file(STRINGS "${CURV_TORCH_CONFIG_DIR}/Caffe2/Caffe2Config.cmake" curv_cuda_line
         REGEX "^[ ]*set\\(CAFFE2_USE_CUDA 1\\)")
    if(curv_cuda_line)
      set(curv_cuda_build ON)
    endif()
  endif()
  set(curv_cuda_toolkit ON)
  if(curv_cuda_build)
    find_package(CUDA QUIET)
    if(NOT CUDA_FOUND)
      set(curv_cuda_toolkit OFF)
    endif()
  endif()
  if(curv_cuda_build AND NOT curv_cuda_toolkit)
    get_filename_component(TORCH_INSTALL_PREFIX "${CURV_TORCH_CONFIG_DIR}/../.." REALPATH)
    message(STATUS "libcurv: ${TORCH_INSTALL_PREFIX} is a CUDA build of LibTorch and no CUDA "
                   "toolkit was found: it is used as a CPU LibTorch")
    set(TORCH_INCLUDE_DIRS "${TORCH_INSTALL_PREFIX}/include"
                           "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
    foreach(lib torch torch_cpu c10)
      find_library(curv_torch_${lib} ${lib} PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH
                   REQUIRED)
    endforeach()
    set(TORCH_LIBRARY "${curv_torch_torch}")
    set(c10_LIBRARY "${curv_torch_c10}")
    # The C++ ABI LibTorch was built with, as its TorchConfig.cmake records it.
    file(STRINGS "${CURV_TORCH_CONFIG_DIR}/Torch/TorchConfig.cmake" curv_abi_line
         REGEX "_GLIBCXX_USE_CXX11_ABI=[01]")
    string(REGEX MATCH "_GLIBCXX_USE_CXX11_ABI=[01]" TORCH_CXX_FLAGS "${curv_abi_line}")
    if(NOT TORCH_CXX_FLAGS)
      set(TORCH_CXX_FLAGS "_GLIBCXX_USE_CXX11_ABI=1")
    endif()
    set(TORCH_CXX_FLAGS "-D${TORCH_CXX_FLAGS}")
    if(NOT TARGET torch)
      add_library(torch SHARED IMPORTED)
      set_target_properties(torch PROPERTIES
        IMPORTED_LOCATION "${curv_torch_torch}"
        INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INCLUDE_DIRS}"
        INTERFACE_LINK_LIBRARIES "${curv_torch_torch_cpu};${curv_torch_c10}"
        INTERFACE_COMPILE_OPTIONS "${TORCH_CXX_FLAGS}"
        # LibTorch 2.x's headers need C++20, as its own config requires of its users.
        INTERFACE_COMPILE_FEATURES cxx_std_20)
    endif()
    set(TORCH_LIBRARIES torch)
    set(TORCH_CUDA_LIBRARIES "")
    set(Torch_FOUND TRUE)
  else()
    find_package(Torch REQUIRED)
  endif()
endmacro()
