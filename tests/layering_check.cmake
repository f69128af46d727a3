# ctest's layering check (docs/library.md#layout):
# - every source and header of an area includes only headers of the areas below it
#   (core ← {io, models, optim} ← analysis), written "curv/…" or <curv/…> alike;
# - a private header (libcurv/src/AREA/*.h) is included by its own area only, except core's,
#   which every area's sources may use; a public header includes no private one;
# - the tools, benchmarks, examples and fuzz targets, above the library, include its public
#   headers only;
# - no string in libcurv names a tool's flag ("--resume"): the library names its options as
#   curv::Error's NamedOption, and each program writes them its own way (docs/library.md#errors);
# - every public header on disk is listed in libcurv/CMakeLists.txt (so the header-alone check
#   and the install cover it).
# Run: cmake -DSOURCE_DIR=<repo> -DLISTED_HEADERS=<a;b;...> -P layering_check.cmake
cmake_minimum_required(VERSION 3.18)
set(areas core io models optim analysis)
set(allowed_core core)
set(allowed_io core io)
set(allowed_models core models)
set(allowed_optim core optim)
set(allowed_analysis core io models optim analysis)
set(failures "")

# The project's includes of `file`, one "path" per entry, whether written with quotes or angles
# (system and third-party headers are left out: they name no area and are not under curv/).
function(project_includes file out)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  set(paths "")
  foreach(line ${lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" path "${line}")
    if(path MATCHES "^curv/" OR path MATCHES "^(core|io|models|optim|analysis)/"
       OR path MATCHES "libcurv/")
      list(APPEND paths "${path}")
    endif()
  endforeach()
  set(${out} "${paths}" PARENT_SCOPE)
endfunction()

foreach(area ${areas})
  file(GLOB_RECURSE sources ${SOURCE_DIR}/libcurv/src/${area}/*)
  file(GLOB_RECURSE public ${SOURCE_DIR}/libcurv/include/curv/${area}/*)
  foreach(file ${sources} ${public})
    set(is_public FALSE)
    if(file IN_LIST public)
      set(is_public TRUE)
    endif()
    project_includes(${file} paths)
    foreach(path ${paths})
      if(path MATCHES "^curv/(core|io|models|optim|analysis)/")
        string(REGEX REPLACE "^curv/([a-z]+)/.*" "\\1" used "${path}")
        if(NOT used IN_LIST allowed_${area})
          list(APPEND failures "${file}: ${area} may not include ${path} (area ${used})")
        endif()
      elseif(path MATCHES "^(core|io|models|optim|analysis)/")
        string(REGEX REPLACE "^([a-z]+)/.*" "\\1" used "${path}")
        if(is_public)
          list(APPEND failures "${file}: a public header includes the private header ${path}")
        elseif(NOT used STREQUAL area AND NOT used STREQUAL "core")
          list(APPEND failures
               "${file}: ${path} is private to ${used} (what ${area} needs belongs in a public header)")
        endif()
      else()
        list(APPEND failures "${file}: include ${path} names no area")
      endif()
    endforeach()
    file(STRINGS ${file} flagged REGEX "\"[^\"]*--[a-z][a-z-]+")
    foreach(line ${flagged})
      if(NOT line MATCHES "^[ \t]*//")
        string(REGEX MATCH "--[a-z][a-z-]+" flag "${line}")
        list(APPEND failures "${file}: a string names a tool's flag (${flag})")
      endif()
    endforeach()
  endforeach()
endforeach()

# Above the library: its public headers only.
file(GLOB_RECURSE clients
     ${SOURCE_DIR}/tools/*.cpp ${SOURCE_DIR}/tools/*.h ${SOURCE_DIR}/bench/*.cpp
     ${SOURCE_DIR}/bench/*.h ${SOURCE_DIR}/examples/*.cpp ${SOURCE_DIR}/examples/*.h
     ${SOURCE_DIR}/fuzz/*.cpp ${SOURCE_DIR}/fuzz/*.h)
foreach(file ${clients})
  project_includes(${file} paths)
  foreach(path ${paths})
    if(NOT path MATCHES "^curv/(core|io|models|optim|analysis)/[^/]+\\.h$")
      list(APPEND failures "${file}: include ${path} is not one of libcurv's public headers")
    endif()
  endforeach()
endforeach()

file(GLOB_RECURSE on_disk ${SOURCE_DIR}/libcurv/include/curv/*.h)
foreach(header ${on_disk})
  if(NOT header IN_LIST LISTED_HEADERS)
    list(APPEND failures "${header}: public header not listed in libcurv/CMakeLists.txt")
  endif()
endforeach()
if(failures)
  # One unwrapped line per violation (FATAL_ERROR text is re-wrapped).
  foreach(failure ${failures})
    message(NOTICE "${failure}")
  endforeach()
  list(LENGTH failures count)
  message(FATAL_ERROR "layering check failed: ${count} violations")
endif()
message(STATUS "layering check: every include follows core <- {io, models, optim} <- analysis "
               "<- tools, bench, examples, fuzz")
