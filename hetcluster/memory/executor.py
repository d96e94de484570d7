"""The scheduled train step: a memory plan applied inside a traced `tf.function` (imports TF).

The model is replayed op by op from its flattened functional graph (`keras_graph.flatten_model`).
Each recompute segment of the plan runs as one `tf.custom_gradient` op whose forward keeps only
the segment's inputs and the tensors read after it; its gradient re-runs the segment under a
fresh tape. Memory-centric segments are bisected into nested custom-gradient halves. Details that
make the result equal to the plain step:

- The recomputation starts under a control dependency on the incoming gradients, so it runs when
  the backward pass reaches the segment — not early, and not merged with the forward ops by
  Grappler's common-subexpression elimination (the inputs differ by that dependency).
- BatchNorm moving statistics are updated in the forward pass only: during recomputation the
  layer's `_assign_moving_average` / `_assign_new_value` are replaced by no-ops.
- Dropout uses `tf.nn.experimental.stateless_dropout` seeded by (step, op index), the step being
  the optimizer's iteration count read once per step, so the recomputed mask is the same mask.
- `jit_compile=False`: XLA clustering could reorder or fuse away the recomputation.
- Weight regularizers (`model.losses`, evaluated on the current weights) are added to the loss, as
  the plain step adds them; activity regularizers, which a layer adds when called, are refused.

Offloaded tensors (discrete GPUs) are passed to the segment that reads them as a copy placed on
the host device; the gradient copies them back after its incoming gradients exist.

Under ParameterServerStrategy one traced step serves every worker: `per_worker_gradients` holds
one gradient function per distinct plan and picks a worker's with `tf.switch_case` on the worker's
index, which ClusterCoordinator feeds to each call of the step (a call-time captured value), so each
worker runs its own device's plan and only its branch executes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from hetcluster.errors import MemoryPlanError
from hetcluster.memory.keras_graph import FlatModel, flatten_model, layer_kind
from hetcluster.memory.plan import MemoryPlan
from hetcluster.memory.planning_utils import cudnn_workspace_limit_mb

log = logging.getLogger(__name__)


class _Always:
    """Keras' `map_arguments` pops from a list per use; we hand out the same tensor every time."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def pop(self) -> Any:
        return self.tensor


class _Lookup:
    def __init__(self, env: dict[str, Any], flat: FlatModel) -> None:
        self.env, self.flat = env, flat

    def __getitem__(self, key: str) -> _Always:
        return _Always(self.env[self.flat.resolve(key)])


@contextlib.contextmanager
def _frozen_statistics(layer: Any) -> Iterator[None]:
    """Calls of a BatchNorm layer inside this block leave its moving statistics alone."""
    layer._assign_moving_average = lambda variable, *args, **kwargs: variable
    layer._assign_new_value = lambda variable, *args, **kwargs: variable
    try:
        yield
    finally:
        del layer._assign_moving_average
        del layer._assign_new_value


_UNREPLAYABLE = ("GaussianNoise", "GaussianDropout", "AlphaDropout")


def _check_replayable(layer: Any) -> None:
    """Random layers other than Dropout would draw new noise when recomputed: refuse them."""
    name = type(layer).__name__
    if name in _UNREPLAYABLE or name.startswith("Random"):
        raise MemoryPlanError(
            f"Layer {layer.name!r} ({name}) draws random numbers the recomputation cannot replay.",
            hint="use Dropout, or plan with a budget that leaves this layer outside recompute segments.",
        )


def _check_no_activity_regularizer(layer: Any) -> None:
    """An activity regularizer adds its loss when its layer is called: the replay calls layers one
    by one, and a recomputed layer twice, so that loss would be lost or counted twice: refuse it.
    (Weight regularizers are fine: model.losses evaluates them on the weights, see gradients_fn.)"""
    if getattr(layer, "activity_regularizer", None) is not None:
        raise MemoryPlanError(f"Layer {layer.name!r} has an activity regularizer, which the memory scheduler's "
                              "layer-by-layer replay cannot count once.",
                              hint="use weight regularizers (kernel_regularizer), or a budget plain TensorFlow fits.")


def _zeros_for(t: Any) -> Any:
    """Zeros shaped like `t` without reading `t` (a ZerosLike op would keep `t` alive)."""
    if t.shape.is_fully_defined():
        return tf.zeros(t.shape, t.dtype)
    return tf.zeros_like(t)


class ScheduledTrainStep:
    """`train_step(x, y) -> loss` of `model` under a memory plan (no plan: the plain step)."""

    def __init__(self, model: Any, loss_fn: Callable[[Any, Any], Any], optimizer: Any,
                 plan: MemoryPlan | None = None, *, host_device: str = "/CPU:0",
                 offload: bool | None = None) -> None:
        self.model, self.loss_fn, self.optimizer, self.plan = model, loss_fn, optimizer, plan
        self.flat = flatten_model(model)
        for op in self.flat.ops:
            _check_no_activity_regularizer(op.layer)
        self.host_device = host_device
        positions = {op.name: i for i, op in enumerate(self.flat.ops)}
        self.segments: dict[int, tuple[list[int], str]] = {}
        for seg in (plan.segments if plan else ()):
            try:
                idx = sorted(positions[name] for name in seg.layers)
            except KeyError as exc:
                raise MemoryPlanError(f"The plan names layer {exc} that the model does not have.",
                                      hint="plan for this very model (hetcluster.memory.fit.graph_of).") from exc
            if idx != list(range(idx[0], idx[0] + len(idx))):
                raise MemoryPlanError("A plan segment is not a contiguous run of the model's layers.",
                                      hint="plan for this very model.")
            self.segments[idx[0]] = (idx, seg.mode)
            for i in idx:
                _check_replayable(self.flat.ops[i].layer)
        if offload is None:
            offload = bool(tf.config.list_physical_devices("GPU"))
        produced = {oid: i for i, op in enumerate(self.flat.ops) for oid in op.output_ids}
        self.offloaded_ids = set()
        if offload and plan:
            for name in plan.offloaded:
                self.offloaded_ids.update(self.flat.ops[positions[name]].output_ids)
        self.readers: dict[str, list[int]] = {}
        for i, op in enumerate(self.flat.ops):
            for tid in op.input_ids:
                self.readers.setdefault(tid, []).append(i)
        self._produced = produced
        self._kinds = [layer_kind(op.layer) if op.node is not None else "input" for op in self.flat.ops]
        self._compiled = tf.function(self.step_fn, jit_compile=False)
        self._compiled_grads = tf.function(self.gradients_fn, jit_compile=False)

    # ---- forward replay -------------------------------------------------------------------
    def _run_op(self, i: int, env: dict[str, Any], recomputing: bool, seed: Any) -> None:
        op = self.flat.ops[i]
        layer = op.layer
        args, kwargs = op.node.map_arguments(_Lookup(env, self.flat))
        kind = self._kinds[i]
        if kind == "dropout" and type(layer).__name__ in ("Dropout", "SpatialDropout1D", "SpatialDropout2D",
                                                          "SpatialDropout3D"):
            x = args[0]
            out = x if layer.rate <= 0 else tf.nn.experimental.stateless_dropout(
                x, rate=layer.rate, seed=tf.stack([seed, tf.constant(i, tf.int32)]),
                noise_shape=layer._get_noise_shape(x))
        else:
            if getattr(layer, "_expects_training_arg", False):
                kwargs = {**kwargs, "training": True}
            with (_frozen_statistics(layer) if recomputing and kind == "bn" else contextlib.nullcontext()):
                out = layer(*args, **kwargs)
        for oid, t in zip(op.output_ids, tf.nest.flatten(out)):
            env[oid] = t

    def _piece_io(self, positions: Sequence[int]) -> tuple[list[str], list[str]]:
        inside = set(positions)
        ins: list[str] = []
        outs: list[str] = []
        model_outs = set(self.flat.output_ids)
        for i in positions:
            for tid in self.flat.ops[i].input_ids:
                if self._produced[tid] not in inside and tid not in ins:
                    ins.append(tid)
            for oid in self.flat.ops[i].output_ids:
                if oid in model_outs or any(r not in inside for r in self.readers.get(oid, ())):
                    outs.append(oid)
        return ins, outs

    def _run_piece(self, positions: list[int], mode: str, env: dict[str, Any], recomputing: bool,
                   seed: Any) -> None:
        ins, outs = self._piece_io(positions)

        def body(inputs: list[Any], recomputing_: bool) -> list[Any]:
            local = dict(zip(ins, inputs))
            if mode == "memory" and len(positions) > 2:
                half = len(positions) // 2
                self._run_piece(positions[:half], mode, local, recomputing_, seed)
                self._run_piece(positions[half:], mode, local, recomputing_, seed)
            else:
                for i in positions:
                    self._run_op(i, local, recomputing_, seed)
            return [local[o] for o in outs]

        device_inputs = [env[t] for t in ins]
        host_mask = [t in self.offloaded_ids for t in ins]
        results = self._recompute_call(body, device_inputs, host_mask, recomputing)
        env.update(zip(outs, results))

    def _recompute_call(self, body: Callable[[list[Any], bool], list[Any]], device_inputs: list[Any],
                        host_mask: list[bool], recomputing: bool) -> list[Any]:
        saved = []
        for t, off in zip(device_inputs, host_mask):
            if off:
                with tf.device(self.host_device):
                    t = tf.identity(t)
            saved.append(t)

        @tf.custom_gradient
        def segment(*args: Any) -> Any:
            # Forward on the device tensors; only `args` (host copies where offloaded) are saved.
            forward_inputs = [d if off else a for a, d, off in zip(args, device_inputs, host_mask)]
            outputs = body(forward_inputs, recomputing)

            def grad(*dys: Any, variables: Any = None) -> Any:
                dys = [_zeros_for(o) if d is None else d for d, o in zip(dys, outputs)]
                with tf.control_dependencies(dys):
                    replay = [tf.identity(a) for a in args]
                with tf.GradientTape() as tape:
                    tape.watch(replay)
                    if variables:
                        tape.watch(variables)
                    recomputed = body(replay, True)
                sources = replay + list(variables or [])
                grads = tape.gradient(recomputed, sources, output_gradients=dys,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
                return grads[:len(replay)], grads[len(replay):]

            return outputs, grad

        return list(segment(*saved))

    def forward(self, inputs: Any, seed: Any) -> list[Any]:
        """Model outputs of a training-mode forward pass under the plan."""
        env: dict[str, Any] = {}
        for tid, x in zip(self.flat.input_ids, tf.nest.flatten(inputs)):
            env[tid] = x
        i, n = 0, len(self.flat.ops)
        while i < n:
            if self.flat.ops[i].node is None:
                i += 1
                continue
            seg = self.segments.get(i)
            if seg is not None:
                self._run_piece(seg[0], seg[1], env, False, seed)
                i = seg[0][-1] + 1
            elif self.offloaded_ids and any(t in self.offloaded_ids for t in self.flat.ops[i].input_ids):
                self._run_piece([i], "speed", env, False, seed)
                i += 1
            else:
                self._run_op(i, env, False, seed)
                i += 1
        return [env[o] for o in self.flat.output_ids]

    # ---- the step -----------------------------------------------------------------------
    def _seed(self) -> Any:
        return tf.cast(tf.math.floormod(self.optimizer.iterations, 2**31 - 1), tf.int32)

    def gradients_fn(self, x: Any, y: Any) -> tuple[Any, list[Any]]:
        """Loss and gradients of the trainable variables (no update; BN statistics do update)."""
        seed = self._seed()
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            outputs = self.forward(x, seed)
            loss = self.loss_fn(y, outputs[0] if len(outputs) == 1 else outputs)
            if self.model.losses:  # weight regularizers, on the current weights (as the plain step adds them)
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
        return loss, tape.gradient(loss, variables)

    def step_fn(self, x: Any, y: Any) -> Any:
        """One training step, traceable: call it inside your own tf.function / strategy.run."""
        loss, grads = self.gradients_fn(x, y)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        return loss

    def __call__(self, x: Any, y: Any) -> Any:
        return self._compiled(x, y)

    def gradients(self, x: Any, y: Any) -> tuple[Any, list[Any]]:
        return self._compiled_grads(x, y)


GradientsFn = Callable[[Any, Any], tuple[Any, list[Any]]]


def per_worker_gradients(branches: Sequence[GradientsFn], branch_of_worker: Sequence[int],
                         variables: Sequence[Any]) -> GradientsFn:
    """``(x, y) -> (loss, gradients of variables)`` running ``branches[branch_of_worker[w]]`` on
    worker ``w`` of a ClusterCoordinator (call it inside a step the coordinator schedules).

    A single distinct branch is returned as it is: no case op, the step every worker ran before.
    """
    if not branches:
        raise MemoryPlanError("No gradient function to run.", hint="pass one per distinct plan.")
    used = sorted(set(branch_of_worker))
    if any(b < 0 or b >= len(branches) for b in used):
        raise MemoryPlanError(f"A worker names branch {used[-1]} of {len(branches)}.", hint="index the branches given.")
    if len(used) <= 1:
        return branches[used[0] if used else 0]
    table = [int(b) for b in branch_of_worker]

    def gradients(x: Any, y: Any) -> tuple[Any, list[Any]]:
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        index = tf.gather(tf.constant(table, tf.int32), tf.cast(worker, tf.int32))

        def case(fn: GradientsFn) -> Callable[[], tuple[Any, list[Any]]]:
            def run() -> tuple[Any, list[Any]]:
                loss, grads = fn(x, y)
                # every branch returns the same structure: dense tensors, zeros for an unconnected weight
                return loss, [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                              for g, v in zip(grads, variables)]
            return run

        loss, grads = tf.switch_case(index, [case(fn) for fn in branches])
        return loss, list(grads)

    return gradients


def build_train_step(model: Any, loss_fn: Callable[[Any, Any], Any], optimizer: Any,
                     plan: MemoryPlan | None = None, **kwargs: Any) -> ScheduledTrainStep:
    """`train_step(x, y) -> loss` applying `plan` (see `ScheduledTrainStep`)."""
    if plan is not None and plan.budget_bytes and tf.config.list_physical_devices("GPU"):
        configure_cudnn_workspace(plan)
    return ScheduledTrainStep(model, loss_fn, optimizer, plan, **kwargs)


def configure_cudnn_workspace(plan: MemoryPlan) -> int:
    """Limit cuDNN's scratch space to what the plan leaves under the budget (GPU processes).

    TensorFlow reads TF_CUDNN_WORKSPACE_LIMIT_IN_MB when it picks convolution algorithms, so this
    must run before the first step. An explicit setting in the environment wins.
    """
    limit_mb = cudnn_workspace_limit_mb(plan)
    if "TF_CUDNN_WORKSPACE_LIMIT_IN_MB" not in os.environ:
        os.environ["TF_CUDNN_WORKSPACE_LIMIT_IN_MB"] = str(limit_mb)
        log.info("cuDNN workspace limited to %d MiB by the memory plan", limit_mb)
    return int(os.environ["TF_CUDNN_WORKSPACE_LIMIT_IN_MB"])
