#!/usr/bin/env bash
# The main job on the embedded default: an emulated fleet of three real agents on this machine
# (a server, a Jetson Nano and a Raspberry Pi 4, each slowed to its share of the CPU), pre-training,
# a plan for each objective, training on the EDP choice, and the report — then the fleet is stopped.
# The job learns scikit-learn's handwritten digits (written here, upscaled to 32x32), keeps a fifth
# of them out of training and scores the exported model on them.
#
# The rpi4's memory budget for the job is cut under what plain TensorFlow needs for this model, so
# it trains under a memory plan of its own beside workers that run the plain step.
#
# Outputs go to demo-out/ (override with DEMO_OUT=...). Knobs: DEMO_MODEL, DEMO_STEPS, DEMO_DEVICES,
# DEMO_TIGHT (device name=budget bytes; empty: every device keeps its catalog budget).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${DEMO_OUT:-demo-out}
model=${DEMO_MODEL:-small_cnn}
steps=${DEMO_STEPS:-3000}
devices=${DEMO_DEVICES:-server,jetson-nano,rpi4}
tight=${DEMO_TIGHT-rpi4=12582912}   # 12 MiB: small_cnn at batch 32 needs 12.4 MiB plain, 11.4 MiB planned
mkdir -p "$out"
state="$out/.hetcluster"
python3 -m hetcluster.models.digits "$out/digits.npz" >/dev/null
job=(--inventory "$out/cluster.toml" --model "$model" --input-shape 32x32x1 --classes 10 --batch-size 32
     --total-steps "$steps" --data "$out/digits.npz" --eval-split 0.2)

cleanup() { hetcluster cluster down --state-dir "$state" >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup

echo "== 1. emulated fleet: $devices"
hetcluster cluster up --name demo --devices "$devices" --state-dir "$state" --out "$out/cluster.toml"
if [ -n "$tight" ]; then   # the inventory's budget is the planner's; the emulated device keeps its catalog memory
  sed -i "/^name = \"${tight%%=*}\"\$/,/^memory_budget_bytes/ s/^memory_budget_bytes = .*/memory_budget_bytes = ${tight#*=}/" \
    "$out/cluster.toml"
fi
hetcluster cluster status --inventory "$out/cluster.toml"

echo "== 2. pre-training and the EDP plan"
hetcluster plan --objective edp "${job[@]}" --workdir "$out/job" --plot "$out/pareto.png"

echo "== 3. the same profile under every objective"
for objective in time power energy edp; do
  hetcluster plan --objective "$objective" "${job[@]}" --profile "$out/job/profile.json" --format json \
    > "$out/plan-$objective.json" 2> >(grep -v '^solo rates revised' >&2)   # step 2 printed it
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"  {d['objective']:>6}: {'+'.join(d['chosen'])}\")" \
    "$out/plan-$objective.json"
done

if hetcluster train --help >/dev/null 2>&1; then
  echo "== 4. training the EDP choice from the pre-training checkpoint"
  hetcluster train --objective edp "${job[@]}" --workdir "$out/job" --profile "$out/job/profile.json" \
    --report "$out/report.json" --export "$out/model.keras" --plot-loss "$out/loss.png"
fi

echo "== done: plots and reports in $out/"
