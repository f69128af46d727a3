"""Rewrites a Trainer's optimizer.pt as Keller Jordan's Muon saves a state over the same
parameters in the same groups (lr, momentum, weight_decay), each state's momentum_buffer the
AdamW state's exp_avg. For the test that a rule whose step is not elementwise is refused on
transformers 5's fused expert tensors.

Usage: as_muon_state.py OPTIMIZER_PT
"""
import sys

import torch


def main():
    path = sys.argv[1]
    saved = torch.load(path, weights_only=True)
    state = {i: {"momentum_buffer": s["exp_avg"]} for i, s in saved["state"].items()}
    groups = [{"params": g["params"], "lr": 0.02, "momentum": 0.95, "weight_decay": 0.0}
              for g in saved["param_groups"]]
    torch.save({"state": state, "param_groups": groups}, path)


if __name__ == "__main__":
    main()
