"""The scheduled train step: equal gradients, BN updated once, dropout replayed, less memory."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("tf_keras")

from test_memory_models import densenet_like, forced_plan, inception_like, resnet_like  # noqa: E402

from hetcluster.errors import MemoryPlanError  # noqa: E402
from hetcluster.memory import DeviceAssumptions, Overheads, plan_for_budget  # noqa: E402
from hetcluster.memory.executor import build_train_step  # noqa: E402
from hetcluster.memory.keras_graph import extract_graph  # noqa: E402
from hetcluster.memory.plan import MemoryPlan, PlannedSegment  # noqa: E402

pytestmark = pytest.mark.tensorflow
BATCH = 4
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data(shape=(16, 16, 3)):
    rng = np.random.RandomState(0)
    return (tf.constant(rng.randn(BATCH, *shape).astype("float32")),
            tf.constant(rng.randint(0, 5, size=BATCH).astype("int32")))


def _plan(model, strategy: str, mode: str | None = None) -> MemoryPlan:
    return forced_plan(model, BATCH, strategy, mode)


def _rel_err(a_list, b_list) -> float:
    """Relative difference of all gradients together (L2), after checking every variable to
    1e-5 relative plus an absolute float32 noise floor of 1e-6: a conv bias feeding BatchNorm has
    a true gradient of zero, so its ~1e-7 values are rounding noise of the summation order."""
    a_all, b_all = [], []
    for a, b in zip(a_list, b_list):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        a_all.append(a.ravel())
        b_all.append(b.ravel())
    a_vec, b_vec = np.concatenate(a_all), np.concatenate(b_all)
    return float(np.linalg.norm(a_vec - b_vec) / np.linalg.norm(a_vec))


def _keras_grads(model, x, y):
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x, training=True))
    return loss, tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("strategy,mode", [("conv", None), ("block", None), ("sqrt", None), ("sqrt", "memory")])
def test_gradients_equal_plain_keras_for_resnet_like(strategy, mode) -> None:
    tf.keras.utils.set_random_seed(1)
    model = resnet_like(keras, blocks=2)
    x, y = _data()
    loss0, plain = _keras_grads(model, x, y)
    step = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), _plan(model, strategy, mode))
    loss1, sched = step.gradients(x, y)
    assert abs(float(loss0) - float(loss1)) <= 1e-5 * abs(float(loss0))
    assert _rel_err(plain, sched) <= 1e-5


@pytest.mark.parametrize("builder", [densenet_like, inception_like])
def test_gradients_equal_for_concat_and_branch_models(builder) -> None:
    tf.keras.utils.set_random_seed(2)
    model = builder(keras)
    x, y = _data()
    _, plain = _keras_grads(model, x, y)
    for strategy in ("conv", "sqrt"):
        step = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), _plan(model, strategy))
        _, sched = step.gradients(x, y)
        assert _rel_err(plain, sched) <= 1e-5, strategy


def test_gradients_equal_plain_keras_along_the_cost_aware_frontier() -> None:
    tf.keras.utils.set_random_seed(6)
    model = resnet_like(keras, blocks=3)
    x, y = _data()
    _, plain = _keras_grads(model, x, y)
    graph = extract_graph(model, BATCH)
    frontier = plan_for_budget(graph, 10**12).frontier
    cost_aware = 0
    for _, peak, _ in frontier[1:]:
        plan = plan_for_budget(graph, peak)  # the frontier's point, or a plan as cheap
        cost_aware += plan.technique == "recompute_cost_aware"
        _, sched = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), plan).gradients(x, y)
        assert _rel_err(plain, sched) <= 1e-5
    assert cost_aware >= 2


def test_dropout_masks_are_replayed_in_recomputation() -> None:
    tf.keras.utils.set_random_seed(3)
    model = resnet_like(keras, blocks=2, dropout=0.5)
    x, y = _data()
    opt = keras.optimizers.SGD(0.1)
    _, plain = build_train_step(model, LOSS, opt, None).gradients(x, y)
    _, sched = build_train_step(model, LOSS, opt, _plan(model, "sqrt", "memory")).gradients(x, y)
    assert _rel_err(plain, sched) <= 1e-5
    # the mask depends on the step: another iteration draws another mask
    opt.iterations.assign_add(1)
    _, other = build_train_step(model, LOSS, opt, None).gradients(x, y)
    with pytest.raises(AssertionError):
        _rel_err(plain, other)


def test_batchnorm_statistics_update_once_per_step() -> None:
    tf.keras.utils.set_random_seed(4)
    model = resnet_like(keras, blocks=1)
    x, y = _data()
    start = [v.numpy() for v in model.variables]
    build_train_step(model, LOSS, keras.optimizers.SGD(0.1), None)(x, y)
    after_plain = {v.name: v.numpy() for v in model.non_trainable_variables}
    for v, value in zip(model.variables, start):
        v.assign(value)
    build_train_step(model, LOSS, keras.optimizers.SGD(0.1), _plan(model, "sqrt", "memory"))(x, y)
    moved = 0
    for v in model.non_trainable_variables:
        np.testing.assert_allclose(v.numpy(), after_plain[v.name], rtol=1e-5, atol=1e-7)
        moved += int(not np.allclose(v.numpy(), start[[w.name for w in model.variables].index(v.name)]))
    assert moved >= 2  # the statistics did move, exactly as in one plain step


def test_offload_path_gives_equal_gradients() -> None:
    tf.keras.utils.set_random_seed(5)
    model = resnet_like(keras, blocks=2)
    x, y = _data()
    g = extract_graph(model, BATCH)
    free = plan_for_budget(g, 10**12, overheads=Overheads(runtime_bytes=0))
    budget = free.fixed_bytes + (free.liveness_peak_bytes - free.fixed_bytes) * 3 // 4
    plan = plan_for_budget(g, budget, "discrete-gpu", overheads=Overheads(runtime_bytes=0),
                           device=DeviceAssumptions(host_link_bytes_per_s=1e15))
    assert plan.offloaded
    _, plain = _keras_grads(model, x, y)
    step = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), plan, offload=True)
    _, sched = step.gradients(x, y)
    assert _rel_err(plain, sched) <= 1e-5


def test_scheduled_step_uses_less_memory() -> None:
    tf.keras.utils.set_random_seed(6)
    model = resnet_like(keras, input_shape=(32, 32, 3), blocks=4, width=32)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.randn(32, 32, 32, 3).astype("float32"))
    y = tf.constant(rng.randint(0, 5, size=32).astype("int32"))
    g = extract_graph(model, 32)
    plan = plan_for_budget(g, 1)  # nothing fits: the smallest-peak plan
    peaks = []
    for p in (None, plan):
        step = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), p)
        step(x, y)
        tf.config.experimental.reset_memory_stats("CPU:0")
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        step(x, y).numpy()
        peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
    assert peaks[1] < 0.7 * peaks[0], peaks


def test_plan_for_another_model_is_refused() -> None:
    model = resnet_like(keras, blocks=1)
    plan = MemoryPlan(**{**plan_for_budget(extract_graph(model, BATCH), 10**12).__dict__,
                         "segments": (PlannedSegment(("nope", "b0_bn1"), "speed"),)})
    with pytest.raises(MemoryPlanError):
        build_train_step(model, LOSS, keras.optimizers.SGD(0.1), plan)


def test_nested_model_gradients_equal() -> None:
    tf.keras.utils.set_random_seed(7)
    inner = resnet_like(keras, blocks=2, name="backbone")
    inputs = keras.Input(shape=(16, 16, 3), name="outer_in")
    outputs = keras.layers.Dense(5, name="head")(keras.layers.ReLU(name="act")(inner(inputs)))
    model = keras.Model(inputs, outputs)
    x, y = _data()
    _, plain = _keras_grads(model, x, y)
    _, sched = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), _plan(model, "sqrt")).gradients(x, y)
    assert _rel_err(plain, sched) <= 1e-5


def test_random_layers_that_cannot_be_replayed_are_refused() -> None:
    inputs = keras.Input(shape=(8,), name="x")
    h = keras.layers.Dense(8, name="d1")(inputs)
    h = keras.layers.GaussianNoise(0.1, name="noise")(h)
    outputs = keras.layers.Dense(3, name="d2")(h)
    model = keras.Model(inputs, outputs)
    base = plan_for_budget(extract_graph(model, BATCH), 10**12)
    plan = MemoryPlan(**{**base.__dict__, "segments": (PlannedSegment(("noise", "d2"), "speed"),)})
    with pytest.raises(MemoryPlanError, match="GaussianNoise"):
        build_train_step(model, LOSS, keras.optimizers.SGD(0.1), plan)


def test_weight_regularizers_count_and_activity_regularizers_are_refused() -> None:
    """A user's model may carry regularizers (the registry's have none): the scheduled step adds the
    weight regularizers' loss as the plain step does, with equal gradients; an activity regularizer,
    which the layer-by-layer replay would drop or count twice, is refused in one line."""
    tf.keras.utils.set_random_seed(3)
    l2 = keras.regularizers.L2(0.05)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", kernel_regularizer=l2, name="c1")(inputs)
    x = keras.layers.ReLU(name="r1")(x)
    x = keras.layers.Conv2D(8, 3, padding="same", name="c2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inputs, keras.layers.Dense(5, kernel_regularizer=l2, name="logits")(x))
    x, y = _data()
    with tf.GradientTape() as tape:
        loss0 = LOSS(y, model(x, training=True)) + tf.add_n(model.losses)
    plain = tape.gradient(loss0, model.trainable_variables)
    loss1, sched = build_train_step(model, LOSS, keras.optimizers.SGD(0.1), _plan(model, "conv")).gradients(x, y)
    assert float(tf.add_n(model.losses)) > 0.01 * float(loss0)  # the regularizer is not lost in the noise
    assert abs(float(loss0) - float(loss1)) <= 1e-5 * abs(float(loss0))
    assert _rel_err(plain, sched) <= 1e-5
    model.get_layer("c2").activity_regularizer = keras.regularizers.L1(0.01)
    with pytest.raises(MemoryPlanError, match="'c2' has an activity regularizer"):
        build_train_step(model, LOSS, keras.optimizers.SGD(0.1), _plan(model, "conv"))
