// The globals a pickle may name and what "calling" each builds: torch.save's tensor rebuild, and
// the classes and helpers of torch.distributed.checkpoint's .metadata (PickleGlobals).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "core/strings.h"
#include "curv/core/error.h"
#include "io/torch_pickle.h"

namespace curv {

namespace {

using Ref = PyValue::Ref;
using Kind = PyValue::Kind;

[[noreturn]] void dcp_fail(const std::string& path, const std::string& why) {
  throw FormatError(fmt::format("{}: {}", path, why));
}

// torch.float32, torch.bfloat16, ..., and the layout and memory formats older writers pickled
// as globals: values, never called.
bool value_global(const std::string& name) {
  static const std::set<std::string> values = {"torch.strided",       "torch.contiguous_format",
                                               "torch.channels_last", "torch.preserve_format",
                                               "torch.float64",       "torch.float32",
                                               "torch.float16",       "torch.bfloat16",
                                               "torch.int64",         "torch.int32",
                                               "torch.int16",         "torch.int8",
                                               "torch.uint8",         "torch.bool",
                                               "torch.float8_e4m3fn", "torch.float8_e5m2",
                                               "torch.complex64",     "torch.complex128"};
  return values.count(name) > 0;
}

// The globals a dialect adds that a REDUCE may call.
const std::set<std::string>& extra_callables(PickleGlobals globals) {
  static const std::set<std::string> dcp = {
      "torch.Size", "torch.serialization._get_layout",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING", "pathlib.PosixPath",
      "pathlib.PurePosixPath"};
  static const std::set<std::string> deepspeed = {"torch.Size",
                                                  "torch._tensor._rebuild_from_type_v2"};
  static const std::set<std::string> none;
  return globals == PickleGlobals::kDcpMetadata ? dcp
         : globals == PickleGlobals::kDeepSpeed ? deepspeed
                                                : none;
}

const std::vector<std::string>& object_classes(PickleGlobals globals) {
  static const std::vector<std::string> none;
  return globals == PickleGlobals::kDcpMetadata ? dcp_metadata_classes()
         : globals == PickleGlobals::kDeepSpeed ? deepspeed_classes()
                                                : none;
}

bool object_class(const std::string& name, PickleGlobals globals) {
  const auto& classes = object_classes(globals);
  return std::find(classes.begin(), classes.end(), name) != classes.end();
}

std::vector<int64_t> int_tuple(const PyValue& v, const char* what, const PickleFail& fail) {
  if (!v.is(Kind::kTuple) && !v.is(Kind::kList)) {
    fail(fmt::format("tensor {} is a {}, expected a tuple of ints", what, v.type_name()));
  }
  std::vector<int64_t> out;
  for (const auto& item : v.items) {
    if (!item->is(Kind::kInt)) fail(fmt::format("tensor {} holds a {}", what, item->type_name()));
    out.push_back(item->integer);
  }
  return out;
}

}  // namespace

Ref rebuild_tensor(const PyValue& args, const PickleFail& fail) {
  if (!args.is(Kind::kTuple) || args.items.size() < 4 || !args.items[0]->is(Kind::kStorage) ||
      !args.items[1]->is(Kind::kInt)) {
    fail(fmt::format("_rebuild_tensor_v2 with arguments {}", args.brief()));
  }
  const PyValue& storage = *args.items[0];
  const int64_t offset = args.items[1]->integer;
  const auto size = int_tuple(*args.items[2], "size", fail);
  const auto stride = int_tuple(*args.items[3], "stride", fail);
  if (size.size() != stride.size()) fail("tensor size and stride differ in length");
  // Every element the view can reach must lie inside the storage.
  int64_t last = offset, numel = 1;
  bool bad = offset < 0;
  for (size_t i = 0; i < size.size() && !bad; ++i) {
    int64_t reach = 0;
    bad = size[i] < 0 || stride[i] < 0 || __builtin_mul_overflow(numel, size[i], &numel) ||
          (size[i] > 0 && (__builtin_mul_overflow(size[i] - 1, stride[i], &reach) ||
                           __builtin_add_overflow(last, reach, &last)));
  }
  if (bad || (numel > 0 && last >= storage.shape[0])) {
    fail(fmt::format(
        "tensor view (offset {}, size {}, stride {}) lies outside storage '{}' of {} "
        "elements",
        offset, shape_string(size), shape_string(stride), storage.text, storage.shape[0]));
  }
  auto v = make_value(Kind::kTensor);
  v->dtype = storage.dtype;
  v->shape = size;
  if (storage.tensor.defined()) {
    // A view of a whole storage in order is the storage itself; anything else is copied out,
    // so a small slice does not keep a large storage alive.
    auto view = storage.tensor.as_strided(size, stride, offset);
    v->tensor = offset == 0 && numel == storage.shape[0] && view.is_contiguous()
                    ? view
                    : view.clone(at::MemoryFormat::Contiguous);
  }
  return v;
}

Ref make_value(Kind kind) {
  auto v = std::make_shared<PyValue>();
  v->kind = kind;
  return v;
}

Ref string_value(const std::string& text) {
  auto v = make_value(Kind::kString);
  v->text = text;
  return v;
}

Ref int_value(int64_t value) {
  auto v = make_value(Kind::kInt);
  v->integer = value;
  return v;
}

Ref tensor_value(const at::Tensor& tensor) {
  auto v = make_value(Kind::kTensor);
  v->tensor = tensor;
  v->shape = tensor.sizes().vec();
  v->dtype = tensor.scalar_type();
  return v;
}

const std::vector<std::string>& dcp_metadata_classes() {
  static const std::vector<std::string> names = {
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.filesystem._StorageInfo"};
  return names;
}

const std::vector<std::string>& deepspeed_classes() {
  static const std::vector<std::string> names = {
      "deepspeed.runtime.fp16.loss_scaler.LossScaler",
      "deepspeed.runtime.zero.config.ZeroStageEnum",
      "deepspeed.utils.tensor_fragment.fragment_address"};
  return names;
}

std::string global_refusal(const std::string& name, PickleGlobals globals) {
  const auto& callables = torch_callable_globals();
  if (std::find(callables.begin(), callables.end(), name) != callables.end() ||
      torch_storage_types().count(name)) {
    return "";
  }
  const bool deepspeed = globals == PickleGlobals::kDeepSpeed;
  if (object_class(name, globals) || extra_callables(globals).count(name) || value_global(name) ||
      (deepspeed && name == "torch.Tensor")) {
    return "";
  }
  std::vector<std::string> allowed = allowed_torch_globals();
  allowed.insert(allowed.end(), object_classes(globals).begin(), object_classes(globals).end());
  allowed.insert(allowed.end(), extra_callables(globals).begin(), extra_callables(globals).end());
  allowed.emplace_back("the torch dtypes");
  if (deepspeed) allowed.push_back("torch.Tensor");
  return fmt::format(
      "the pickle names the global '{}', which is not allowed (only plain data, tensors and "
      "state dicts are read; allowed: {})",
      name, join(allowed, ", "));
}

namespace dcp_pickle {

bool callable(const std::string& name, PickleGlobals globals) {
  return extra_callables(globals).count(name) > 0 || object_class(name, globals);
}

Ref new_object(const std::string& path, const PyValue& cls, const PyValue& args,
               PickleGlobals globals) {
  if (!cls.is(Kind::kGlobal) || !object_class(cls.text, globals)) {
    dcp_fail(path, fmt::format("NEWOBJ on {}, which is not an allowed class", cls.brief()));
  }
  if (!args.is(Kind::kTuple)) dcp_fail(path, fmt::format("NEWOBJ with arguments {}", args.brief()));
  auto v = make_value(Kind::kObject);
  v->text = cls.text;
  v->items = args.items;
  return v;
}

void build_object(const std::string& path, PyValue& object, const Ref& state) {
  auto adopt = [&](const PyValue& dict) {
    for (const auto& [key, value] : dict.entries) {
      if (!key->is(Kind::kString)) {
        dcp_fail(path, fmt::format("{} has a non-string attribute", object.text));
      }
      object.entries.emplace_back(key, value);
    }
  };
  if (state->is(Kind::kDict)) {
    adopt(*state);
  } else if (state->is(Kind::kTuple) && state->items.size() == 2 &&
             (state->items[0]->is(Kind::kDict) || state->items[0]->is(Kind::kNone)) &&
             state->items[1]->is(Kind::kDict)) {
    // (dict or None, slots dict): a class with __slots__.
    if (state->items[0]->is(Kind::kDict)) adopt(*state->items[0]);
    adopt(*state->items[1]);
  } else if (state->is(Kind::kTuple)) {
    object.items = state->items;  // a class's own __getstate__ tuple (TensorProperties)
  } else {
    dcp_fail(path, fmt::format("BUILD of {} with state {}", object.text, state->brief()));
  }
}

Ref reduce(const std::string& path, const std::string& name, const PyValue& args,
           PickleGlobals globals) {
  if (object_class(name, globals)) {
    // An enum member (ZeroStageEnum(2)): an object holding its value.
    auto v = make_value(Kind::kObject);
    v->text = name;
    v->items = args.items;
    return v;
  }
  if (name == "torch._tensor._rebuild_from_type_v2") {
    // (func, type, args, state): a tensor subclass rebuilt by func; kept as the plain tensor.
    if (args.items.size() < 3 || !args.items[2]->is(Kind::kTuple) ||
        !args.items[0]->is(Kind::kGlobal) ||
        args.items[0]->text != "torch._utils._rebuild_tensor_v2") {
      dcp_fail(path, fmt::format("{} with arguments {}", name, args.brief()));
    }
    return rebuild_tensor(*args.items[2], [&](const std::string& why) { dcp_fail(path, why); });
  }
  const bool is_path = name == "pathlib.PosixPath" || name == "pathlib.PurePosixPath";
  if (!is_path && args.items.size() != 1) {
    dcp_fail(path, fmt::format("{} with arguments {}", name, args.brief()));
  }
  if (name == "torch.Size") {
    const PyValue& sizes = *args.items[0];
    bool ints = sizes.is(Kind::kTuple);
    for (const auto& item : sizes.items) ints = ints && item->is(Kind::kInt);
    if (!ints) dcp_fail(path, fmt::format("torch.Size of {}", args.brief()));
    return args.items[0];
  }
  if (name == "torch.serialization._get_layout") {
    if (!args.items[0]->is(Kind::kString))
      dcp_fail(path, fmt::format("{} of {}", name, args.brief()));
    return args.items[0];  // 'torch.strided'
  }
  if (!is_path) {  // _MEM_FORMAT_ENCODING(index)
    if (!args.items[0]->is(Kind::kInt)) dcp_fail(path, fmt::format("{} of {}", name, args.brief()));
    return args.items[0];
  }
  std::vector<std::string> parts;
  for (const auto& item : args.items) {
    if (!item->is(Kind::kString)) dcp_fail(path, fmt::format("{} of {}", name, args.brief()));
    parts.push_back(item->text);
  }
  auto v = make_value(Kind::kString);
  v->text = join(parts, "/");
  return v;
}

}  // namespace dcp_pickle

}  // namespace curv
