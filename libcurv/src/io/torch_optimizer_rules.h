// Which update rule a torch optimizer.state_dict() belongs to (not public API). torch saves no
// class name, so each rule libcurv rebuilds declares the state it requires and the param_group
// keys it reads or may ignore; a state is that rule's only when nothing else is present, and a
// state two rules accept is refused unless the user names one (docs/optimizers.md).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace curv::torch_state {

// What one param_group records, as far as recognition needs it.
struct GroupKeys {
  std::set<std::string> keys;                // every key but "params" and "param_names"
  std::map<std::string, bool> flags;         // the keys whose value is a bool
  std::map<std::string, std::string> texts;  // the keys whose value is a string
  std::optional<double> weight_decay;        // "weight_decay" when it is a number
  // Per-parameter state keys over the group's parameters (tensors other than "step").
  std::set<std::string> state;
};

// What recognition reads of a whole state, plus what its file implies about its writer.
struct OptimizerKeys {
  std::vector<GroupKeys> groups;
  // The rule the file's writer always uses, when the layout says (nanoGPT's train.py builds
  // torch.optim.AdamW): settles Adam against AdamW, which record the same keys in torch < 2.7.
  std::string implied_rule, implied_by;
};

struct Recognition {
  std::string rule;     // libcurv's rule ("adamw"); "" when refused
  std::string writer;   // the writer it stands for ("torch.optim.AdamW")
  std::string how;      // "named by the user (adam)", "recognised by keys ..."
  std::string refusal;  // when `rule` is empty: one line naming the file and what failed
  // Per group: whether its parameters are orthogonalised (the Muon family's groups).
  std::vector<bool> orthogonalised;

  // "torch.optim.AdamW, recognised by keys: ...": meta's optimizer.recognition.
  std::string text() const { return writer + ", " + how; }
};

// The rule of `keys`, or a refusal: by keys alone when `named` is empty, else the named rule
// checked against the state (it must fit, whatever markers it lacks). `origin` names the file.
Recognition recognise_optimizer(const OptimizerKeys& keys, const std::string& origin,
                                const std::string& named = "");

// One line per rule: "name (writer): state keys" (torch_optimizer_rules()).
std::vector<std::string> rule_lines();

}  // namespace curv::torch_state
