// The pickle virtual machine of load_torch_file: data-building opcodes only, globals from a fixed
// allow-list, tensors rebuilt as views of the storages the archive gives.
#include "io/torch_pickle.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/strings.h"
#include "curv/core/error.h"

namespace curv {

namespace {

using Ref = PyValue::Ref;
using Kind = PyValue::Kind;

// The pickle virtual machine. Only data-building opcodes exist here; a REDUCE is accepted only on
// an allowed global and is carried out by C++ code, so no Python-level code can run.
class Unpickler {
 public:
  Unpickler(const std::string& path, const std::string& data, StorageReader read_storage,
            PickleGlobals globals)
      : path_(path), data_(data), read_storage_(std::move(read_storage)), globals_(globals) {}

  // A pickle can make a container hold itself (L = []; L.append(L)); shared references alone
  // would then never be released. A failed run, or a tree rejected as cyclic, empties every
  // container it built so that all of it is freed.
  ~Unpickler() {
    if (!succeeded_) release_containers();
  }

  Ref run() {
    while (true) {
      if (pos_ >= data_.size()) fail("pickle ends without STOP");
      const size_t at = pos_;
      const uint8_t op = byte();
      if (op == '.') {  // STOP
        if (stack_.size() != 1 || !marks_.empty()) fail("STOP with an unbalanced stack");
        reject_cycles(stack_.back());
        succeeded_ = true;
        return stack_.back();
      }
      if (!control_op(op) && !container_op(op) && !value_op(op) && !memo_op(op)) {
        fail(fmt::format("unsupported pickle opcode 0x{:02x} at byte {}", op, at));
      }
    }
  }

  // Framing, marks, stack manipulation, globals, persistent ids, REDUCE and BUILD; false when `op`
  // is not one of them.
  bool control_op(uint8_t op) {
    switch (op) {
      case 0x80:
        byte();
        break;  // PROTO
      case 0x95:
        bytes(8);
        break;  // FRAME: framing is irrelevant in memory
      case '(':
        marks_.push_back(stack_.size());
        break;     // MARK
      case 'c': {  // GLOBAL "module\nname\n"
        const std::string module = line(), name = line();
        push(global(module + "." + name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        auto name = pop();
        auto module = pop();
        if (!module->is(Kind::kString) || !name->is(Kind::kString)) {
          fail("STACK_GLOBAL needs two strings");
        }
        push(global(module->text + "." + name->text));
        break;
      }
      case '0':
        pop();
        break;  // POP
      case '1':
        pop_mark();
        break;  // POP_MARK
      case '2':
        push(top());
        break;  // DUP
      case 'Q':
        push(persistent(pop()));
        break;     // BINPERSID
      case 'R': {  // REDUCE
        auto args = pop();
        auto callable = pop();
        push(reduce(*callable, *args));
        break;
      }
      case 'b': {  // BUILD
        auto state = pop();
        if (top()->is(Kind::kObject)) {
          dcp_pickle::build_object(path_, *top(), state);
          break;
        }
        // OrderedDict state dicts carry `_metadata` (module versions) as instance state; it
        // has no bearing on the tensors, so it is dropped.
        if (!top()->is(Kind::kDict)) {
          fail(fmt::format("BUILD on a {}", top()->type_name()));
        }
        break;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), for the allowed classes only
        auto args = pop();
        auto cls = pop();
        if (globals_ == PickleGlobals::kTorchSave) fail("NEWOBJ: no class may be built here");
        push(dcp_pickle::new_object(path_, *cls, *args, globals_));
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // Opcodes that build or fill tuples, lists and dicts; false when `op` is not one of them.
  bool container_op(uint8_t op) {
    switch (op) {
      case '}':
        push(make_value(Kind::kDict));
        break;
      case ']':
        push(make_value(Kind::kList));
        break;
      case ')':
        push(make_value(Kind::kTuple));
        break;
      case 0x8f:
        push(make_value(Kind::kList));
        break;  // EMPTY_SET, kept as a list
      case 't':
        push(sequence(Kind::kTuple, pop_mark()));
        break;
      case 'l':
        push(sequence(Kind::kList, pop_mark()));
        break;
      case 0x91:
        push(sequence(Kind::kList, pop_mark()));
        break;  // FROZENSET
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        const size_t n = op - 0x84;
        std::vector<Ref> items(n);
        for (size_t i = n; i-- > 0;) items[i] = pop();
        push(sequence(Kind::kTuple, std::move(items)));
        break;
      }
      case 'd': {  // DICT
        auto items = pop_mark();
        auto dict = make_value(Kind::kDict);
        set_items(*dict, items);
        push(dict);
        break;
      }
      case 'a': {  // APPEND
        auto v = pop();
        expect(top(), Kind::kList, "APPEND").items.push_back(v);
        break;
      }
      case 'e':
      case 0x90: {  // APPENDS, ADDITEMS
        auto items = pop_mark();
        auto& list = expect(top(), Kind::kList, "APPENDS");
        list.items.insert(list.items.end(), items.begin(), items.end());
        break;
      }
      case 's': {  // SETITEM
        auto value = pop();
        auto key = pop();
        set_items(expect(top(), Kind::kDict, "SETITEM"), {key, value});
        break;
      }
      case 'u': {  // SETITEMS
        auto items = pop_mark();
        set_items(expect(top(), Kind::kDict, "SETITEMS"), items);
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // Opcodes that push a number, a string, bytes, None or a bool; false when `op` is not one of
  // them.
  bool value_op(uint8_t op) {
    switch (op) {
      case 'J':
        push(integer(static_cast<int32_t>(unsigned_le(4))));
        break;  // BININT
      case 'K':
        push(integer(unsigned_le(1)));
        break;  // BININT1
      case 'M':
        push(integer(unsigned_le(2)));
        break;  // BININT2
      case 0x8a:
        push(integer(long_le(byte())));
        break;  // LONG1
      case 0x8b:
        push(integer(long_le(unsigned_le(4))));
        break;     // LONG4
      case 'G': {  // BINFLOAT, big-endian IEEE double
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | byte();
        auto v = make_value(Kind::kFloat);
        std::memcpy(&v->real, &bits, sizeof bits);
        push(v);
        break;
      }
      case 'X':
        push(text(Kind::kString, unsigned_le(4)));
        break;  // BINUNICODE
      case 0x8c:
        push(text(Kind::kString, byte()));
        break;  // SHORT_BINUNICODE
      case 0x8d:
        push(text(Kind::kString, unsigned_le(8)));
        break;  // BINUNICODE8
      case 'T':
        push(text(Kind::kString, unsigned_le(4)));
        break;  // BINSTRING
      case 'U':
        push(text(Kind::kString, byte()));
        break;  // SHORT_BINSTRING
      case 'B':
        push(text(Kind::kBytes, unsigned_le(4)));
        break;  // BINBYTES
      case 'C':
        push(text(Kind::kBytes, byte()));
        break;  // SHORT_BINBYTES
      case 0x8e:
        push(text(Kind::kBytes, unsigned_le(8)));
        break;  // BINBYTES8
      case 'N':
        push(make_value(Kind::kNone));
        break;
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        auto v = make_value(Kind::kBool);
        v->boolean = op == 0x88;
        push(v);
        break;
      }
      default:
        return false;
    }
    return true;
  }

  // The memo: PUT and GET in their forms; false when `op` is not one of them.
  bool memo_op(uint8_t op) {
    switch (op) {
      case 'q':
        memo_[unsigned_le(1)] = top();
        break;  // BINPUT
      case 'r':
        memo_[unsigned_le(4)] = top();
        break;  // LONG_BINPUT
      case 0x94:
        memo_[memo_.size()] = top();
        break;  // MEMOIZE
      case 'p':
        memo_[text_index()] = top();
        break;  // PUT
      case 'h':
        push(memo(unsigned_le(1)));
        break;  // BINGET
      case 'j':
        push(memo(unsigned_le(4)));
        break;  // LONG_BINGET
      case 'g':
        push(memo(text_index()));
        break;  // GET
      default:
        return false;
    }
    return true;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    // torch.save's pickle is a record of the archive; DCP's .metadata is the whole file.
    throw FormatError(fmt::format(
        "{}: {}{}", path_, globals_ != PickleGlobals::kDcpMetadata ? "data.pkl: " : "", why));
  }

  uint8_t byte() {
    if (pos_ >= data_.size()) fail("truncated pickle");
    return static_cast<uint8_t>(data_[pos_++]);
  }
  std::string bytes(uint64_t n) {
    if (n > data_.size() - pos_) fail("truncated pickle");
    std::string out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t unsigned_le(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(byte()) << (8 * i);
    return v;
  }
  // Two's-complement little-endian integer of n bytes; Python ints beyond 64 bits are rejected.
  int64_t long_le(uint64_t n) {
    if (n == 0) return 0;
    if (n > 8) fail(fmt::format("integer of {} bytes does not fit 64 bits", n));
    uint64_t v = unsigned_le(static_cast<int>(n));
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
    return static_cast<int64_t>(v);
  }
  std::string line() {
    const auto end = data_.find('\n', pos_);
    if (end == std::string::npos) fail("truncated pickle");
    std::string out = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }
  uint64_t text_index() {
    const std::string t = line();
    try {
      return std::stoull(t);
    } catch (const std::exception&) {
      fail(fmt::format("memo index '{}' is not a number", t));
    }
  }

  void push(Ref v) {
    const Kind k = v->kind;
    if (k == Kind::kList || k == Kind::kTuple || k == Kind::kDict || k == Kind::kObject)
      containers_.push_back(v);
    stack_.push_back(std::move(v));
  }

  // FormatError when a container holds itself, directly or further down: no checkpoint does, and
  // such a tree could not be released. Iterative, as a pickle may nest a million levels deep.
  void reject_cycles(const Ref& root) const {
    enum class Color : uint8_t { kOpen, kDone };
    std::unordered_map<const PyValue*, Color> color;
    // (value, index of the next child to visit)
    std::vector<std::pair<const PyValue*, size_t>> path{{root.get(), 0}};
    color[root.get()] = Color::kOpen;
    auto child = [](const PyValue& v, size_t i) -> const PyValue* {
      if (i < v.items.size()) return v.items[i].get();
      i -= v.items.size();
      if (i / 2 < v.entries.size()) {
        return (i % 2 == 0 ? v.entries[i / 2].first : v.entries[i / 2].second).get();
      }
      return nullptr;
    };
    while (!path.empty()) {
      auto& [value, next] = path.back();
      const PyValue* c = child(*value, next++);
      if (c == nullptr) {
        color[value] = Color::kDone;
        path.pop_back();
        continue;
      }
      if (c->items.empty() && c->entries.empty()) continue;
      const auto it = color.find(c);
      if (it == color.end()) {
        color[c] = Color::kOpen;
        path.emplace_back(c, 0);
      } else if (it->second == Color::kOpen) {
        fail(fmt::format("a {} contains itself ({}); no checkpoint holds a cyclic container",
                         c->type_name(), c->brief()));
      }
    }
  }

  // Empties every container still alive, children moved out first and released after, so that
  // no destructor recurses and cycles are broken.
  void release_containers() noexcept {
    std::vector<Ref> garbage;
    for (const auto& weak : containers_) {
      if (Ref v = weak.lock()) {
        for (auto& item : v->items) garbage.push_back(std::move(item));
        for (auto& [key, value] : v->entries) {
          garbage.push_back(std::move(key));
          garbage.push_back(std::move(value));
        }
        v->items.clear();
        v->entries.clear();
      }
    }
    stack_.clear();
    memo_.clear();
    storages_.clear();
    garbage.clear();
  }
  Ref pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) {
      fail("pop from an empty stack");
    }
    Ref v = stack_.back();
    stack_.pop_back();
    return v;
  }
  const Ref& top() const {
    if (stack_.empty()) fail("empty stack");
    return stack_.back();
  }
  std::vector<Ref> pop_mark() {
    if (marks_.empty()) fail("no MARK");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Ref> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  Ref memo(uint64_t index) const {
    auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo index {} was never stored", index));
    return it->second;
  }
  PyValue& expect(const Ref& v, Kind kind, const char* op) const {
    if (!v->is(kind)) fail(fmt::format("{} on a {}", op, v->type_name()));
    return *v;
  }

  static Ref sequence(Kind kind, std::vector<Ref> items) {
    auto v = make_value(kind);
    v->items = std::move(items);
    return v;
  }
  static Ref integer(int64_t value) {
    auto v = make_value(Kind::kInt);
    v->integer = value;
    return v;
  }
  Ref text(Kind kind, uint64_t n) {
    auto v = make_value(kind);
    v->text = bytes(n);
    return v;
  }
  void set_items(PyValue& dict, const std::vector<Ref>& items) const {
    if (items.size() % 2) fail("SETITEMS with an odd number of items");
    for (size_t i = 0; i < items.size(); i += 2) {
      // A repeated key replaces the value in place, as a Python dict does.
      bool replaced = false;
      if (items[i]->is(Kind::kString) || items[i]->is(Kind::kInt)) {
        for (auto& [k, v] : dict.entries) {
          if (k->kind == items[i]->kind && k->text == items[i]->text &&
              k->integer == items[i]->integer) {
            v = items[i + 1];
            replaced = true;
          }
        }
      }
      if (!replaced) dict.entries.emplace_back(items[i], items[i + 1]);
    }
  }

  Ref global(const std::string& name) const {
    const std::string refusal = global_refusal(name, globals_);
    if (!refusal.empty()) fail(refusal);
    auto v = make_value(Kind::kGlobal);
    v->text = name;
    return v;
  }

  // ('storage', storage_type, key, location, numel): the tensor bytes in record data/<key>.
  Ref persistent(const Ref& pid) {
    if (!pid->is(Kind::kTuple) || pid->items.size() != 5 || !pid->items[0]->is(Kind::kString) ||
        pid->items[0]->text != "storage") {
      fail(fmt::format("persistent id {} is not ('storage', type, key, location, numel)",
                       pid->brief()));
    }
    const auto& type = *pid->items[1];
    const auto& key = *pid->items[2];
    const auto& numel = *pid->items[4];
    if (!type.is(Kind::kGlobal) || !torch_storage_types().count(type.text) ||
        !key.is(Kind::kString) || !numel.is(Kind::kInt) || numel.integer < 0) {
      fail(fmt::format("malformed storage reference {}", pid->brief()));
    }
    auto cached = storages_.find(key.text);
    if (cached != storages_.end()) return cached->second;
    auto storage = make_value(Kind::kStorage);
    storage->dtype = torch_storage_types().at(type.text);
    storage->shape = {numel.integer};
    storage->text = key.text;
    if (read_storage_) {
      storage->tensor = read_storage_(key.text, storage->dtype, numel.integer, type.text);
    }
    storages_.emplace(key.text, storage);
    return storage;
  }

  Ref reduce(const PyValue& callable, const PyValue& args) const {
    if (!callable.is(Kind::kGlobal)) fail(fmt::format("REDUCE on a {}", callable.type_name()));
    if (!args.is(Kind::kTuple)) fail(fmt::format("REDUCE with arguments {}", args.brief()));
    const std::string& name = callable.text;
    if (dcp_pickle::callable(name, globals_))
      return dcp_pickle::reduce(path_, name, args, globals_);
    if (name == "collections.OrderedDict") {
      auto dict = make_value(Kind::kDict);
      if (!args.items.empty()) {
        const auto& pairs = *args.items[0];
        if (!pairs.is(Kind::kList) && !pairs.is(Kind::kTuple)) fail("OrderedDict of a non-list");
        for (const auto& pair : pairs.items) {
          if (!pair->is(Kind::kTuple) || pair->items.size() != 2)
            fail("OrderedDict item not a pair");
          set_items(*dict, pair->items);
        }
      }
      return dict;
    }
    if (name == "torch._utils._rebuild_tensor_v2") {
      return rebuild_tensor(args, [this](const std::string& why) { fail(why); });
    }
    if (name == "torch._utils._rebuild_parameter" ||
        name == "torch._utils._rebuild_parameter_with_state") {
      if (args.items.empty() || !args.items[0]->is(Kind::kTensor)) {
        fail(fmt::format("{} with arguments {}", name, args.brief()));
      }
      return args.items[0];  // a Parameter is its data; requires_grad is irrelevant here
    }
    if (name == "pytorch_optimizer.optimizer.scion.LMONorm") {
      // SCION's norm_type, an IntEnum: its value.
      if (args.items.size() != 1 || !args.items[0]->is(Kind::kInt)) {
        fail(fmt::format("{} with arguments {}", name, args.brief()));
      }
      return args.items[0];
    }
    fail(fmt::format("the global '{}' cannot be called", name));
  }

  std::string path_;
  const std::string& data_;
  StorageReader read_storage_;
  PickleGlobals globals_;
  size_t pos_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Ref> memo_;
  std::map<std::string, Ref> storages_;
  std::vector<std::weak_ptr<PyValue>> containers_;  // every list, tuple and dict pushed
  bool succeeded_ = false;
};

}  // namespace

PyValue::Ref unpickle(const std::string& path, const std::string& pickle,
                      StorageReader read_storage, PickleGlobals globals) {
  return Unpickler(path, pickle, std::move(read_storage), globals).run();
}

}  // namespace curv
