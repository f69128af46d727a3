// The built-in checkpoint layouts, registered in this order (not public API).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "curv/io/checkpoint_layout.h"

namespace curv {

std::shared_ptr<const CheckpointLayoutReader> native_layout();        // step_<N>/ folders
std::shared_ptr<const CheckpointLayoutReader> nanogpt_layout();       // ckpt.pt, ckpt_<X>.pt
std::shared_ptr<const CheckpointLayoutReader> hf_layout();            // checkpoint-<N>/ folders
std::shared_ptr<const CheckpointLayoutReader> hf_revisions_layout();  // step<N>/ model folders
std::shared_ptr<const CheckpointLayoutReader> torch_steps_layout();   // step_<N>.pt files
std::shared_ptr<const CheckpointLayoutReader> torchtitan_layout();    // step-<N>/ DCP folders
std::shared_ptr<const CheckpointLayoutReader> accelerate_layout();    // checkpoint-<N>/ FSDP DCP
std::shared_ptr<const CheckpointLayoutReader> deepspeed_layout();     // global_step<N>/ ZeRO

// The bytes of a file; FormatError naming it when it cannot be read.
std::string read_text_file(const std::string& path);

// A non-negative decimal integer, all of `text`, as steps are written in names; nullopt otherwise
// (18 digits at most, so it cannot overflow).
std::optional<int64_t> step_number(const std::string& text);

}  // namespace curv
