"""Memory scheduler benchmark: measured peak memory and step time, plain TensorFlow vs scheduled.

Parts (run any subset: ``benchmarks/memory.py 1 4``):
1. ResNet-50, batch 32, 64x64 and 128x128 inputs: plain TF, the plans the fit chooses for budgets
   of 3/4, 0.55 and 1/2 of plain's measured peak (cost-aware frontier), and the smallest-peak
   plan: peak ratio and step-time overhead of each.
2. Largest batch under a fixed budget, ResNet-50 and VGG-16: the batch the fit admits with our
   plans against the largest batch plain TF measured under it.
3. Deepest CIFAR ResNet (basic blocks, depth 6n+2) under a fixed budget, ours vs plain.
4. Predicted against measured peak of every run, the worst under-prediction per kind of step
   against the fit's margin (cost.PeakMargin), and how many budgeted runs went over the budget.
5. A mixed emulated fleet (server and jetson-nano agents; the nano's budget needs a plan):
   the job's throughput with per-worker plans against every worker under the nano's plan.

Memory: `tf.config.experimental.get_memory_info('CPU:0')['peak']` (TensorFlow's CPU allocator
statistics, available on this TF build with oneDNN on, which the benchmark sets) after
`reset_memory_stats`, one fresh subprocess per configuration so nothing else lives in the
allocator; the peak is absolute (weights, optimizer slots and the batch included), which is what
the plan predicts. Step time: one process builds the plain step and every plan's step on one
model and runs them in turn, round after round, so load from other work on the host falls on all
of them alike; the fastest step of each, as wall clock and as process CPU time.

Usage: .venv/bin/python benchmarks/memory.py [1] [2] [3] [4] [5] [--sizes 64,128] [--json points.json]
(``--sizes``: part 1's input sizes; ``--json`` writes part 1's measured points for
``hetcluster memplan --plot --measured``; a file that exists gains the new points.)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MIB = 2**20
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the parent builds graphs too: keep its output to figures

from hetcluster.tfenv import prepare_tf_env, tf_env  # noqa: E402


# ---- one measurement (child process) ----------------------------------------------------------
def deep_resnet(keras: Any, blocks_per_stage: int, input_shape=(32, 32, 3), classes: int = 10) -> Any:
    """CIFAR ResNet-(6n+2) of basic blocks (He et al. 2016), widths 16/32/64."""
    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(inputs)
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    for s, width in enumerate((16, 32, 64)):
        for b in range(blocks_per_stage):
            stride = 2 if s > 0 and b == 0 else 1
            p = f"s{s}b{b}_"
            y = keras.layers.Conv2D(width, 3, stride, padding="same", use_bias=False, name=p + "c1")(x)
            y = keras.layers.BatchNormalization(name=p + "n1")(y)
            y = keras.layers.ReLU(name=p + "r1")(y)
            y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name=p + "c2")(y)
            y = keras.layers.BatchNormalization(name=p + "n2")(y)
            if stride != 1:
                x = keras.layers.Conv2D(width, 1, stride, use_bias=False, name=p + "proj")(x)
            x = keras.layers.Add(name=p + "add")([x, y])
            x = keras.layers.ReLU(name=p + "out")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x), name=f"resnet{6 * blocks_per_stage + 2}")


def build(spec: dict[str, Any]) -> Any:
    import tf_keras as keras

    if spec["model"] == "deep_resnet":
        return deep_resnet(keras, spec["n"])
    from hetcluster.models.registry import build_model

    return build_model(spec["model"], (spec["hw"], spec["hw"], 3), 10)


def plan_of(graph: Any, spec: dict[str, Any]) -> Any:
    """The plan a spec runs: "plain" (no budget), "budget" (the fit's choice for spec["budget"],
    margin kept: what training would run), "smallest" (the smallest-peak plan, no budget)."""
    from hetcluster.memory import plan_for_budget
    from hetcluster.memory.fit import plan_for

    if "plan" not in spec:  # the memory-capacity notebook's specs: scheduled under a budget, or plain
        spec = {**spec, "plan": "budget" if spec["scheduled"] else "plain"}
    if spec["plan"] == "budget":
        return plan_for(graph, graph.batch_size, spec["budget"])
    return plan_for_budget(graph, 1 if spec["plan"] == "smallest" else 1 << 50)


def _data(model: Any, batch: int) -> tuple[Any, Any]:
    import numpy as np
    import tensorflow as tf

    rng = np.random.RandomState(0)
    shape = model.inputs[0].shape.as_list()[1:]
    return (tf.constant(rng.randn(batch, *shape).astype("float32")),
            tf.constant(rng.randint(0, 10, size=batch).astype("int32")))


def _step(model: Any, plan: Any) -> Any:
    """The training step of ``plan`` (the plain Keras step where it needs none), with its own optimizer."""
    import tensorflow as tf
    import tf_keras as keras

    from hetcluster.memory.executor import build_train_step

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.01, momentum=0.9)
    if plan.technique != "none":
        return build_train_step(model, loss_fn, opt, plan)

    @tf.function(jit_compile=False)
    def step(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return step


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of one configuration's step (this process holds nothing else)."""
    import tensorflow as tf

    from hetcluster.memory.keras_graph import extract_graph

    model = build(spec)
    plan = plan_of(extract_graph(model, spec["batch"]), spec)
    x, y = _data(model, spec["batch"])
    step = _step(model, plan)
    step(x, y).numpy()  # traces, creates the optimizer slots
    peaks, times = [], []
    for _ in range(spec.get("steps", 2)):
        tf.config.experimental.reset_memory_stats("CPU:0")
        started = time.perf_counter()
        step(x, y).numpy()
        times.append(time.perf_counter() - started)
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    return {"measured_peak_bytes": max(peaks), "step_s": min(times), "predicted_peak_bytes": plan.predicted_peak_bytes,
            "technique": plan.technique, "fits": plan.fits, "predicted_slowdown": plan.predicted_slowdown,
            "needed_bytes": plan.needed_bytes, "liveness_peak_bytes": plan.liveness_peak_bytes}


def time_steps(specs: list[dict[str, Any]], rounds: int) -> list[dict[str, float]]:
    """Fastest wall and CPU step time of each spec's step (one model, steps run in turn)."""
    import time as clock

    from hetcluster.memory.keras_graph import extract_graph

    model = build(specs[0])
    graph = extract_graph(model, specs[0]["batch"])
    x, y = _data(model, specs[0]["batch"])
    steps = [_step(model, plan_of(graph, spec)) for spec in specs]
    for step in steps:
        step(x, y).numpy()
    wall = [[] for _ in steps]
    cpu = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            t0, c0 = clock.perf_counter(), clock.process_time()
            step(x, y).numpy()
            wall[i].append(clock.perf_counter() - t0)
            cpu[i].append(clock.process_time() - c0)
    return [{"step_s": min(w), "step_cpu_s": min(c)} for w, c in zip(wall, cpu)]


# ---- orchestration (parent process) ---------------------------------------------------------------
RUNS: list[tuple[str, dict[str, Any], dict[str, Any]]] = []


def _child(*args: str) -> Any:
    # the product's TF settings, oneDNN included: TF's CPU allocator statistics exist only with it
    env = tf_env(TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"measurement {args[:2]} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(label: str, spec: dict[str, Any]) -> dict[str, Any]:
    result = _child("--measure", json.dumps(spec))
    RUNS.append((label, spec, result))
    err = result["predicted_peak_bytes"] / result["measured_peak_bytes"] - 1
    budget = spec.get("budget", 0) if spec.get("plan", "budget" if spec.get("scheduled") else "") == "budget" else 0
    verdict = ""
    if budget and not result["fits"]:
        verdict = f"  budget {budget / MIB:.0f} MiB: refused by the fit (needs {result['needed_bytes'] / MIB:.0f} MiB)"
    elif budget:
        verdict = f"  budget {budget / MIB:.0f} MiB: {'OVER' if result['measured_peak_bytes'] > budget else 'under'}"
    print(f"  {label:<40} measured {result['measured_peak_bytes'] / MIB:8.1f} MiB  predicted "
          f"{result['predicted_peak_bytes'] / MIB:8.1f} MiB ({err:+.1%})  [{result['technique']}]{verdict}",
          flush=True)
    return result


def largest(lo: int, hi: int, fits) -> int:  # type: ignore[no-untyped-def]
    """Largest value in [lo, hi] with fits(value) (fits monotone, fits(lo) assumed)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def predicted_largest_batch(model_name: str, hw: int, budget: int, scheduled: bool) -> int:
    """The largest batch the fit admits: under a plan (``scheduled``), or plain TF's step."""
    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.model_graph import graph_of

    g1 = graph_of(model_name, 1, (hw, hw, 3), 10)
    if scheduled:
        return largest(1, 4096, lambda b: plan_for(g1, b, budget).fits)
    return largest(1, 4096, lambda b: plan_for(g1, b, budget).technique == "none")


def verified(label: str, spec: dict[str, Any], key: str, budget: int, shrink, grow,  # type: ignore[no-untyped-def]
             max_grows: int = 2) -> dict[str, Any]:
    """The largest measured ``key`` (batch, depth) under the budget, starting from the predicted one
    (the memory-capacity notebook's search): over the budget, shrink and measure again (up to 3
    times); under it, grow while it stays under (up to ``max_grows`` times)."""
    best = None
    grown = 0
    for attempt in range(5):
        result = {**run(f"{label} {key}={spec[key]}", spec), key: spec[key]}
        if result["measured_peak_bytes"] <= budget:
            best = result
            if attempt >= 2 or grown >= max_grows or grow(spec[key]) == spec[key]:
                break
            spec = {**spec, key: grow(spec[key])}
            grown += 1
        elif best is not None or spec[key] <= 1 or attempt >= 3:
            break
        else:
            spec = {**spec, key: shrink(spec[key])}
    return best if best is not None else {**result, "over_budget": True}


def main(parts: set[int], json_path: Path | None, sizes: tuple[int, ...] = (64, 128)) -> None:
    started = time.time()
    points: list[dict[str, Any]] = []
    if 1 in parts:
        points = part_one(sizes)
    if 2 in parts:
        part_two()
    if 3 in parts:
        part_three()
    if 4 in parts or RUNS:
        part_four(started)
    if 5 in parts:
        part_five()
    if json_path is not None and points:
        kept = json.loads(json_path.read_text())["points"] if json_path.exists() else []
        new = {(p["input_shape"][0], p["label"]) for p in points}
        kept = [p for p in kept if (p["input_shape"][0], p["label"]) not in new]
        json_path.write_text(json.dumps({"points": kept + points}, indent=2))
        print(f"measured points written to {json_path}")


PART_ONE_FRACTIONS = (0.75, 0.55, 0.5)


def part_one(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    print("1) ResNet-50, batch 32, SGD+momentum: plain TF, the fit's plans for budgets of a fraction of "
          "plain's measured peak, and the smallest-peak plan")
    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.model_graph import graph_of

    points = []
    for hw in sizes:
        base = {"model": "resnet50", "hw": hw, "batch": 32}
        plain = run(f"resnet50 {hw}x{hw} plain TF", {**base, "plan": "plain"})
        specs = []
        for fraction in PART_ONE_FRACTIONS:
            spec = {**base, "plan": "budget", "budget": int(fraction * plain["measured_peak_bytes"])}
            plan = plan_for(graph_of("resnet50", 1, (hw, hw, 3), 10), 32, spec["budget"])
            if plan.fits:
                specs.append(spec)
            else:
                print(f"  resnet50 {hw}x{hw} {_what(spec, plain):<26} refused by the fit: the smallest plan needs "
                      f"{plan.needed_bytes / MIB:.0f} MiB")
        specs.append({**base, "plan": "smallest"})
        results = [run(f"resnet50 {hw}x{hw} {_what(s, plain)}", s) for s in specs]
        times = _child("--time", json.dumps([{**base, "plan": "plain"}, *specs]), "4")
        base_time = times[0]
        for spec, result, timed in zip(specs, results, times[1:]):
            wall = timed["step_s"] / base_time["step_s"] - 1
            cpu = timed["step_cpu_s"] / base_time["step_cpu_s"] - 1
            ratio = result["measured_peak_bytes"] / plain["measured_peak_bytes"]
            print(f"  {hw}x{hw} {_what(spec, plain):<26} peak {ratio:.2f} of plain TF, step time {wall:+.0%} wall, "
                  f"{cpu:+.0%} CPU (predicted {result['predicted_slowdown']:+.0%})  [{result['technique']}]")
            points.append({"model": "resnet50", "input_shape": [hw, hw, 3], "classes": 10, "batch_size": 32,
                           "label": _what(spec, plain), "technique": result["technique"],
                           "measured_peak_bytes": result["measured_peak_bytes"],
                           "predicted_peak_bytes": result["predicted_peak_bytes"],
                           "predicted_slowdown": result["predicted_slowdown"],
                           "measured_slowdown_cpu": cpu, "measured_slowdown_wall": wall,
                           "plain_measured_peak_bytes": plain["measured_peak_bytes"]})
        print(f"  {hw}x{hw} plain TF step: {base_time['step_s']:.2f} s wall, {base_time['step_cpu_s']:.2f} s CPU")
    return points


def _what(spec: dict[str, Any], plain: dict[str, Any]) -> str:
    if spec["plan"] == "smallest":
        return "smallest-peak plan"
    return f"budget {spec['budget'] / plain['measured_peak_bytes']:.2f} of plain"


def part_two() -> None:
    print("2) Largest batch under a fixed budget: the fit's batch with our plans, plain TF's measured largest")
    for model_name, hw, budget in (("resnet50", 64, 640 * MIB), ("vgg16", 32, 600 * MIB)):
        from hetcluster.memory.fit import plan_for
        from hetcluster.memory.model_graph import graph_of

        g1 = graph_of(model_name, 1, (hw, hw, 3), 10)
        ours_batch = largest(1, 4096, lambda b: plan_for(g1, b, budget).fits)
        plain_batch = largest(1, 4096, lambda b: plan_for(g1, b, budget).technique == "none")
        base = {"model": model_name, "hw": hw, "budget": budget, "steps": 1, "plan": "budget"}
        run(f"{model_name} ours batch={ours_batch}", {**base, "batch": ours_batch})
        plain = run(f"{model_name} plain batch={plain_batch}", {**base, "batch": plain_batch})
        best = plain_batch if plain["measured_peak_bytes"] <= budget else 0
        for _ in range(2):  # fair to plain TF: grow while its measured peak stays under the budget
            probe = int(best * 1.08) + 1 if best else max(1, int(plain_batch * 0.9))
            result = run(f"{model_name} plain probe batch={probe}", {**base, "plan": "plain", "batch": probe})
            if result["measured_peak_bytes"] > budget:
                break
            best = probe
        print(f"  {model_name} {hw}x{hw} under {budget / MIB:.0f} MiB: plain TF batch {best} (measured), ours "
              f"{ours_batch} ({ours_batch / max(best, 1):.2f}x)")


def part_three() -> None:
    print("3) Deepest CIFAR ResNet (basic blocks, depth 6n+2), batch 32, 32x32, under a fixed budget")
    budget = 160 * MIB
    import tf_keras as keras

    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.keras_graph import extract_graph

    graphs: dict[int, Any] = {}

    def plan(n: int) -> Any:
        if n not in graphs:
            graphs[n] = extract_graph(deep_resnet(keras, n), 32)
        return plan_for(graphs[n], 32, budget)

    cap = 48  # ResNet-290: keeps the run within minutes; "ours" reaching it means at least that deep
    plain_n = largest(1, cap, lambda k: plan(k).technique == "none")
    ours_n = largest(plain_n, cap, lambda k: plan(k).fits)
    base = {"model": "deep_resnet", "batch": 32, "budget": budget, "steps": 1, "plan": "budget"}
    run(f"resnet-{6 * ours_n + 2} ours", {**base, "n": ours_n})
    plain = run(f"resnet-{6 * plain_n + 2} plain", {**base, "n": plain_n})
    best = plain_n if plain["measured_peak_bytes"] <= budget else 0
    for _ in range(2):  # fair to plain TF: deeper while its measured peak stays under the budget
        probe = best + max(1, best // 10) if best else max(1, plain_n - 1)
        result = run(f"resnet-{6 * probe + 2} plain probe", {**base, "plan": "plain", "n": probe})
        if result["measured_peak_bytes"] > budget:
            break
        best = probe
    capped = " (the search cap: at least this deep)" if ours_n == cap else ""
    print(f"  under {budget / MIB:.0f} MiB: plain TF ResNet-{6 * best + 2} (measured), ours ResNet-{6 * ours_n + 2}"
          f"{capped} ({(6 * ours_n + 2) / (6 * best + 2):.2f}x deeper)")


def part_four(started: float) -> None:
    from hetcluster.memory import PeakMargin

    print("4) Predicted vs measured peak; the fit's margin; budgeted runs over their budget")
    worst = {True: 0.0, False: 0.0}
    over = budgeted = 0
    for label, spec, result in RUNS:
        under = result["measured_peak_bytes"] / result["predicted_peak_bytes"] - 1  # > 0: under-predicted
        plain = result["technique"] == "none"
        worst[plain] = max(worst[plain], under)
        if spec.get("plan") == "budget" and result["fits"]:
            budgeted += 1
            over += result["measured_peak_bytes"] > spec["budget"]
        print(f"  {label:<40} predicted {result['predicted_peak_bytes'] / MIB:8.1f}  measured "
              f"{result['measured_peak_bytes'] / MIB:8.1f} MiB  measured over predicted {under:+.1%}")
    margin = PeakMargin()
    print(f"  worst under-prediction: plain TF {worst[True]:+.1%} (margin {margin.plain:.0%}), scheduled "
          f"{worst[False]:+.1%} (margin {margin.scheduled:.0%})")
    print(f"  budgeted runs the fit admitted: {budgeted}, measured over their budget: {over}; "
          f"total {time.time() - started:.0f} s")


FLEET_MODEL = ("mobilenet_v2", (64, 64, 3), 10, 16)
FLEET_NANO_BUDGET = 70 * MIB  # mobilenet_v2 64x64 batch 16: a plan of about +14 % step time (plain needs 128 MiB)


def part_five(reps: int = 2, steps: int = 160) -> None:
    """Both rules on the same emulated fleet and TF servers, alternating, each run a fresh job."""
    from hetcluster.emulation.catalog import load_catalog
    from hetcluster.emulation.cluster import cluster_down, cluster_up
    from hetcluster.memory.fit import plan_for
    from hetcluster.memory.model_graph import graph_of
    from hetcluster.models.spec import ModelSpec
    from hetcluster.training.launch import launch_cluster
    from hetcluster.training.run_job import run_in_subprocess
    from hetcluster.training.spec import TrainSpec

    name, shape, classes, batch = FLEET_MODEL
    model = ModelSpec(name, shape, classes, batch)
    plan = plan_for(graph_of(name, 1, shape, classes), batch, FLEET_NANO_BUDGET)
    print(f"5) Mixed emulated fleet (server, jetson-nano), {name} {shape[0]}x{shape[1]} batch {batch}: the nano's "
          f"{FLEET_NANO_BUDGET / MIB:.0f} MiB budget needs {plan.technique} (predicted {plan.predicted_slowdown:+.0%})")
    rules = {"per-worker plans": {"jetson-nano": FLEET_NANO_BUDGET},
             "tightest plan for all": {"server": FLEET_NANO_BUDGET, "jetson-nano": FLEET_NANO_BUDGET}}
    rates: dict[str, list[float]] = {rule: [] for rule in rules}
    with tempfile.TemporaryDirectory(prefix="membench-") as tmp:
        root = Path(tmp)
        inventory = cluster_up(load_catalog().select(["server", "jetson-nano"]), root / "cluster.toml",
                               name=f"membench{abs(hash(tmp)) % 10000}", state_dir=root / "state")
        try:
            with launch_cluster([inventory.device(n) for n in inventory.names], inventory.parameter_server_host,
                                isolation=inventory.tf_plane_isolation) as cluster:
                for rep in range(reps):
                    for rule, budgets in (rules.items() if rep % 2 == 0 else reversed(rules.items())):
                        spec = TrainSpec(model=model, total_steps=steps, warmup_steps=10, warmup_s=5.0,
                                         worker_budgets_bytes=budgets, start_barrier=True)
                        result = run_in_subprocess(spec, cluster.addresses, timeout_s=900, plane=cluster.plane)
                        per_worker = result.worker_steps_per_s(steady_only=True)
                        rates[rule].append(result.steps_per_s)
                        print(f"  {rule:<22} {result.steps_per_s:6.2f} steps/s (" + ", ".join(
                            f"{w} {r:.2f}" for w, r in per_worker.items()) + f"; plans: {result.memory_plan})",
                            flush=True)
        finally:
            cluster_down(root / "state")
    per, tight = (statistics.median(rates[r]) for r in rules)
    print(f"  job throughput, per-worker plans / tightest plan for all: {per:.2f} / {tight:.2f} steps/s = "
          f"{per / tight:.2f}x (median of {reps} runs each, alternating)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        prepare_tf_env()
        print(json.dumps(measure(json.loads(sys.argv[2]))))
    elif len(sys.argv) == 4 and sys.argv[1] == "--time":
        prepare_tf_env()
        print(json.dumps(time_steps(json.loads(sys.argv[2]), int(sys.argv[3]))))
    else:
        args = sys.argv[1:]
        out = Path(args[args.index("--json") + 1]) if "--json" in args else None
        sizes = tuple(int(s) for s in args[args.index("--sizes") + 1].split(",")) if "--sizes" in args else (64, 128)
        chosen = {int(a) for a in args if a.isdigit()} or {1, 2, 3, 4}
        main(chosen, out, sizes)
