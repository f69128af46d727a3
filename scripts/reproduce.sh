#!/usr/bin/env bash
# The reproduction study (docs/reproduction.md): does the loss curve less sharply along Muon's
# updates than along AdamW's, and does the gap grow with the Zipf exponent s of the data?
#
#   1. Sweep: the 4-layer LLaMA of examples/configs/llama-tiny.json trained for STEPS updates with
#      AdamW, Muon and NorMuon at three learning rates each (more while the best is at an end of
#      those tried), at every s, seed 0.
#   2. Per optimizer and s, the learning rate with the lowest validation loss after STEPS updates
#      is chosen (OUT/sweep.csv records every run) and trained with the other seeds.
#   3. ndsprobe audits every chosen run's update at every saved checkpoint on the balanced probe
#      set (s = 0), with layer and with component blocks, head/tail token buckets defined by the
#      training stream's counts, and paired AdamW/Muon and AdamW/NorMuon comparisons per seed.
#   4. A control: AdamW and Muon at every s at the rates chosen at the first s, probed with layer
#      blocks, since the rate itself moves the sharpness an optimizer settles at.
#   5. tools/python/reproduce_summary.py writes OUT/summary.md, OUT/summary.json and the plots.
#
# Resumable: run it again after an interruption and it skips finished training runs, continues
# unfinished ones exactly (curvtrain --resume) and keeps finished ndsprobe units (--resume).
# Settings (environment): CURV_REPRO_DIR (out/reproduce), CURV_REPRO_STEPS (1000),
# CURV_REPRO_CHECKPOINTS (10: saved and probed every STEPS/10 updates), CURV_REPRO_SEEDS
# ("0 1 2 3 4"), CURV_REPRO_EXPONENTS ("0 0.5 1"), CURV_REPRO_MODEL (a built-in model config;
# examples/configs/llama-tiny.json), CURV_REPRO_JOBS (the number of cores: processes at once, one
# thread each), CURV_BUILD_DIR (build), CURV_SKIP_BUILD=1. scripts/optimizers.sh runs the same
# steps on other optimizers through CURV_REPRO_OPTIMIZERS ("adamw muon normuon"; AdamW first, the
# baseline of every comparison), CURV_REPRO_BLOCKS ("layer component"), CURV_REPRO_CONTROL (1:
# step 4 runs) and CURV_REPRO_SUMMARY (tools/python/reproduce_summary.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${CURV_BUILD_DIR:-$root/build}"
out="${CURV_REPRO_DIR:-$root/out/reproduce}"
steps="${CURV_REPRO_STEPS:-1000}"
seeds="${CURV_REPRO_SEEDS:-0 1 2 3 4}"
exponents="${CURV_REPRO_EXPONENTS:-0 0.5 1}"
jobs="${CURV_REPRO_JOBS:-$(nproc)}"
model="${CURV_REPRO_MODEL:-$root/examples/configs/llama-tiny.json}"
checkpoints="${CURV_REPRO_CHECKPOINTS:-10}"
optimizers="${CURV_REPRO_OPTIMIZERS:-adamw muon normuon}"
blocks_list="${CURV_REPRO_BLOCKS:-layer component}"
control="${CURV_REPRO_CONTROL:-1}"
summary="${CURV_REPRO_SUMMARY:-$root/tools/python/reproduce_summary.py}"
save_every=$((steps / checkpoints))
if [ "$save_every" -lt 1 ] || [ $((save_every * checkpoints)) -ne "$steps" ]; then
  echo "reproduce.sh: CURV_REPRO_STEPS=$steps must be a multiple of CURV_REPRO_CHECKPOINTS=$checkpoints" >&2
  exit 2
fi

# The learning-rate ladders: AdamW's, SOAP's, Shampoo's and Schedule-Free AdamW's around the
# usual 1e-3 of small transformers, Adafactor's around torch's relative step 1e-2, Muon's and
# NorMuon's around the 0.02 of modded-nanogpt; Muon and NorMuon update embeddings, head and norms
# with AdamW at adam_lr = 3e-3. No weight decay anywhere, so only the step rule differs; every
# other hyper-parameter is the reference class's default (docs/optimizers.md). The sweep starts
# with the middle three rungs and, while the best validation loss sits at an end of the rungs
# tried, adds the next rung beyond it, so the chosen rate is bracketed (or the ladder ends).
declare -A ladder=(
  [adamw]="1e-4 3e-4 1e-3 3e-3 1e-2 3e-2"
  [muon]="0.002 0.005 0.01 0.02 0.05 0.1"
  [normuon]="0.002 0.005 0.01 0.02 0.05 0.1"
  [soap]="1e-4 3e-4 1e-3 3e-3 1e-2 3e-2"
  [shampoo]="1e-4 3e-4 1e-3 3e-3 1e-2 3e-2"
  [adafactor]="1e-3 3e-3 1e-2 3e-2 1e-1 3e-1"
  [adamw-schedulefree]="1e-4 3e-4 1e-3 3e-3 1e-2 3e-2"
)
first_rung=1 last_rung=3  # the middle three of six
if [ "${optimizers%% *}" != adamw ]; then
  echo "reproduce.sh: CURV_REPRO_OPTIMIZERS='$optimizers' must start with adamw, the baseline" >&2
  exit 2
fi
for opt in $optimizers; do
  if [ -z "${ladder[$opt]:-}" ]; then
    echo "reproduce.sh: no learning-rate ladder for '$opt' (known: ${!ladder[*]})" >&2
    exit 2
  fi
done
spec() {  # spec OPTIMIZER LR
  case "$1" in
    muon | normuon) echo "$1:lr=$2,adam_lr=3e-3,weight_decay=0" ;;
    # Schedule-Free warms up itself and keeps its rate: curvtrain's schedule stays flat (train).
    adamw-schedulefree) echo "$1:lr=$2,weight_decay=0,warmup_steps=50" ;;
    *) echo "$1:lr=$2,weight_decay=0" ;;
  esac
}

if [ "${CURV_SKIP_BUILD:-0}" != 1 ]; then "$root/scripts/build.sh"; fi
curvtrain="$build/tools/curvtrain/curvtrain"
ndsprobe="$build/tools/ndsprobe/ndsprobe"
mkdir -p "$out/runs" "$out/logs"
start=$(date +%s)
say() { echo "[$(($(date +%s) - start)) s] $*"; }

# train DIR SPEC S SEED: one curvtrain run, skipped when finished, continued when interrupted.
train() {
  local dir="$1" spec="$2" s="$3" seed="$4" name
  name="$(basename "$(dirname "$dir")")/$(basename "$dir")"
  if [ -f "$dir/step_$steps/model.safetensors" ]; then return 0; fi
  local resume=() schedule=(--warmup 50)
  if [ -f "$dir/step_0/model.safetensors" ]; then resume=(--resume); else rm -rf "$dir"; fi
  if [[ "$spec" == adamw-schedulefree:* ]]; then schedule=(--warmup 0 --min-lr-ratio 1); fi
  if ! "$curvtrain" -o "$dir" --model "$model" --optimizer "$spec" --zipf-s "$s" --seed "$seed" \
    --steps "$steps" --batch-size 32 "${schedule[@]}" --save-every "$save_every" \
    --eval-every "$save_every" --probe-sequences 128 --threads 1 --quiet "${resume[@]}" \
    >"$out/logs/${name//\//_}.log" 2>&1; then
    echo "training $name failed; see $out/logs/${name//\//_}.log" >&2
    return 1
  fi
  echo "  trained $name: $(tail -n 1 "$dir/log.csv" | cut -d, -f4) validation loss"
}
export -f train
export out steps model curvtrain save_every

# run_jobs FILE: the lines of FILE (argument lists of `train`) JOBS at a time.
run_jobs() {
  xargs -P "$jobs" -L 1 bash -c 'train "$@"' _ <"$1"
}

say "sweep: ${optimizers// /, } at s = ${exponents// /, }, seed 0, $steps updates each"
declare -A lo hi chosen
for s in $exponents; do for opt in $optimizers; do lo[$s/$opt]=$first_rung hi[$s/$opt]=$last_rung; done; done
rung() { local r=(${ladder[$1]}); echo "${r[$2]}"; }
rungs() { local r=(${ladder[$1]}); echo "${#r[@]}"; }
final_loss() {  # final_loss S OPT LR: the run's validation loss after the last update
  local loss
  loss=$(tail -n 1 "$out/runs/s$1/${2}_lr${3}_seed0/log.csv" | cut -d, -f4)
  # A diverged run (nan, inf) is never chosen.
  [[ "$loss" =~ ^[0-9.]+([eE][-+]?[0-9]+)?$ ]] && echo "$loss" || echo inf
}
while :; do
  : >"$out/logs/sweep.jobs"
  for s in $exponents; do
    for opt in $optimizers; do
      for ((i = lo[$s/$opt]; i <= hi[$s/$opt]; i++)); do
        lr=$(rung "$opt" "$i")
        echo "$out/runs/s$s/${opt}_lr${lr}_seed0 $(spec "$opt" "$lr") $s 0" >>"$out/logs/sweep.jobs"
      done
    done
  done
  run_jobs "$out/logs/sweep.jobs"
  extended=0
  for s in $exponents; do
    for opt in $optimizers; do
      best="" best_loss=inf best_i=0
      for ((i = lo[$s/$opt]; i <= hi[$s/$opt]; i++)); do
        lr=$(rung "$opt" "$i")
        loss=$(final_loss "$s" "$opt" "$lr")
        if [ "$loss" != inf ] && { [ -z "$best" ] || awk "BEGIN { exit !($loss < $best_loss) }"; }; then
          best=$lr best_loss=$loss best_i=$i
        fi
      done
      if [ -z "$best" ]; then echo "every $opt run at s = $s diverged; see $out/runs/s$s" >&2; exit 1; fi
      chosen[$s/$opt]=$best
      if [ "$best_i" -eq "${lo[$s/$opt]}" ] && [ "$best_i" -gt 0 ]; then
        lo[$s/$opt]=$((best_i - 1)) extended=1
        say "s = $s, $opt: best at the lowest rate tried ($best); adding $(rung "$opt" $((best_i - 1)))"
      elif [ "$best_i" -eq "${hi[$s/$opt]}" ] && [ "$best_i" -lt $(($(rungs "$opt") - 1)) ]; then
        hi[$s/$opt]=$((best_i + 1)) extended=1
        say "s = $s, $opt: best at the highest rate tried ($best); adding $(rung "$opt" $((best_i + 1)))"
      fi
    done
  done
  [ "$extended" = 1 ] || break
done

# The sweep's table: every rate tried, and the choice.
echo "s,optimizer,lr,val_loss,chosen" >"$out/sweep.csv.tmp"
for s in $exponents; do
  for opt in $optimizers; do
    for ((i = lo[$s/$opt]; i <= hi[$s/$opt]; i++)); do
      lr=$(rung "$opt" "$i")
      echo "$s,$opt,$lr,$(final_loss "$s" "$opt" "$lr"),$([ "$lr" = "${chosen[$s/$opt]}" ] && echo 1 || echo 0)" >>"$out/sweep.csv.tmp"
    done
    say "s = $s, $opt: lr = ${chosen[$s/$opt]} chosen (validation loss $(final_loss "$s" "$opt" "${chosen[$s/$opt]}"))"
  done
done
mv "$out/sweep.csv.tmp" "$out/sweep.csv"

say "seeds ${seeds// /, } at the chosen learning rates"
: >"$out/logs/seeds.jobs"
for s in $exponents; do
  for opt in $optimizers; do
    lr=${chosen[$s/$opt]}
    for seed in $seeds; do
      echo "$out/runs/s$s/${opt}_lr${lr}_seed$seed $(spec "$opt" "$lr") $s $seed" >>"$out/logs/seeds.jobs"
    done
  done
done
run_jobs "$out/logs/seeds.jobs"

# The study's runs under short names (ndsprobe names a run by its directory): study/sS/OPT_seedK.
for s in $exponents; do
  mkdir -p "$out/study/s$s"
  for opt in $optimizers; do
    for seed in $seeds; do
      ln -sfn "../../runs/s$s/${opt}_lr${chosen[$s/$opt]}_seed$seed" "$out/study/s$s/${opt}_seed$seed"
    done
  done
done

# Fixed-rate control. A larger learning rate settles at lower sharpness, so when the sweep picks
# different rates at different s, the rate moves each optimizer's NDS as much as the data do.
# The control trains AdamW and Muon at every s with the rates chosen at the first s.
s_first="${exponents%% *}"
if [ "$control" = 1 ]; then
  say "fixed-rate control: adamw at ${chosen[$s_first/adamw]}, muon at ${chosen[$s_first/muon]} at every s"
  : >"$out/logs/control.jobs"
  for s in $exponents; do
    [ "$s" = "$s_first" ] && continue
    mkdir -p "$out/control/s$s"
    for opt in adamw muon; do
      lr=${chosen[$s_first/$opt]}
      for seed in $seeds; do
        echo "$out/runs/s$s/${opt}_lr${lr}_seed$seed $(spec "$opt" "$lr") $s $seed" >>"$out/logs/control.jobs"
        ln -sfn "../../runs/s$s/${opt}_lr${lr}_seed$seed" "$out/control/s$s/${opt}_seed$seed"
      done
    done
  done
  run_jobs "$out/logs/control.jobs"
fi

# probe SET S BLOCKS: ndsprobe over every run of SET (study or control) at exponent S, resumable.
# The study's files: ndsprobe_sS_BLOCKS.h5; the control's (layer blocks): ndsprobe_control_sS.h5.
probe() {
  local set="$1" s="$2" blocks="$3" runs=() compare=() extra=() output opts
  if [ "$set" = study ]; then
    opts="$optimizers" output="$out/ndsprobe_s${s}_$blocks.h5"
    extra=(--token-buckets head --token-counts "$out/study/s$s/adamw_seed${seeds%% *}/token_counts.json")
  else
    opts="adamw muon" output="$out/ndsprobe_control_s$s.h5"
  fi
  for opt in $opts; do for seed in $seeds; do runs+=("$out/$set/s$s/${opt}_seed$seed"); done; done
  for seed in $seeds; do
    for opt in $opts; do
      [ "$opt" = adamw ] || compare+=(--compare "adamw_seed$seed/update:${opt}_seed$seed/update")
    done
  done
  local log="$out/logs/$(basename "$output" .h5).log"
  "$ndsprobe" "${runs[@]}" --data "$out/$set/s$s/adamw_seed${seeds%% *}/probe.safetensors" \
    --directions update --blocks "$blocks" "${extra[@]}" --batch-size 32 "${compare[@]}" \
    --threads 1 --quiet --resume -o "$output" >"$log" 2>&1 ||
    { echo "ndsprobe on the $set runs at s = $s ($blocks blocks) failed; see $log" >&2; return 1; }
  echo "  probed the $set runs at s = $s with $blocks blocks"
}
export -f probe
export ndsprobe optimizers seeds

say "ndsprobe: every run's update at every checkpoint, blocks: ${blocks_list// /, }"
{
  for s in $exponents; do for blocks in $blocks_list; do echo "study $s $blocks"; done; done
  if [ "$control" = 1 ]; then
    for s in $exponents; do [ "$s" = "$s_first" ] || echo "control $s layer"; done
  fi
} | xargs -P "$jobs" -L 1 bash -c 'probe "$@"' _

say "summary"
/usr/bin/python3 "$summary" "$out"
say "study finished: $out/summary.md"
