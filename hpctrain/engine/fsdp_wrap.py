"""FSDP2 on the ranks (engine/ddp.py imports this only on a rank): torch's fully_shard over a
device mesh, unit by unit, bottom-up, then the root (FSDP2's documented use: one all-gather and one
reduce-scatter per unit, overlapped with the neighbouring units' compute).

The mesh is 1-D for fsdp (every rank a shard) and replicate x shard for hsdp (FSDP2 shards
over the second dimension and all-reduces over the first). Mixed precision follows precision=:
parameters gathered in bf16/fp16, gradients reduced in fp32.

Exposed communication is measured as DDP's is (ddp_wrap.py): each unit stamps when its backward
computation is done (Stamp.watch); everything backward() takes after the last stamp is waiting
for the reduce-scatters (FSDP2 waits for them at the end of backward).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from hpctrain.config.schema import ShardSettings
from hpctrain.engine.clock import Clock, Mark
from hpctrain.errors import HpctrainError
from hpctrain.records import Layout

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}
WRAPPED = "_checkpoint_wrapped_module"  # activation checkpointing's wrapper holds the block here


class ShardError(HpctrainError):
    """parallelism.shard.modules names nothing in the model."""

    quiet = True  # the message says it all


class Stamp:
    """The clock's mark of when the latest unit's backward computation ended (None: none this
    step)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ready: Mark | None = None

    def hook(self, module: nn.Module, grad_in: Any, grad_out: Any) -> None:
        self.ready = self.clock.mark()

    def watch(self, unit: nn.Module) -> None:
        """Mark as each of the unit's parameter groups starts its post-backward (its backward
        computation done, its reduce-scatter not yet issued). A full backward hook marks the same
        moment, but wraps every unit's inputs and outputs in autograd nodes: 10% of a step of the
        communication-bound MLP on 2 CPU ranks (hpctrain bench overhead --model mlp --engines fsdp:
        0.897 of the hand-written loop with it, 1.034 without). torch's FSDP2 keeps the groups
        privately: where they are not found, the full backward hook."""
        state = getattr(unit, "_get_fsdp_state", lambda: None)()
        groups = list(getattr(state, "_fsdp_param_groups", None) or [])
        if not groups or not all(callable(getattr(g, "post_backward", None)) for g in groups):
            unit.register_full_backward_hook(self.hook)
            return
        for group in groups:
            group.post_backward = self._marking(group.post_backward)

    def _marking(self, post_backward: Any) -> Any:
        def marked(*args: Any, **kwargs: Any) -> Any:
            self.ready = self.clock.mark()
            return post_backward(*args, **kwargs)

        return marked

    def take(self) -> Mark | None:
        ready, self.ready = self.ready, None
        return ready


def mesh_for(device_type: str, replicate: int, shard: int) -> Any:
    if replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (replicate, shard), mesh_dim_names=("replicate", "shard"))


def find_units(model: nn.Module, names: list[str]) -> list[nn.Module]:
    """The modules named (module names as in named_modules(), or class names), deepest first:
    fully_shard must reach a module's children before the module itself."""
    found: dict[str, nn.Module] = {}
    modules = [(n, m) for n, m in model.named_modules() if n and WRAPPED not in n]
    unknown = []
    for name in names:
        hits = [(n, m) for n, m in modules if n == name or type(getattr(m, WRAPPED, m)).__name__ == name]
        if not hits:
            unknown.append(name)
        found.update(hits)
    if unknown:
        classes = sorted({type(getattr(m, WRAPPED, m)).__name__ for _, m in modules})
        names = [n for n, _ in modules if n.count(".") < 2]  # the upper levels: what users name
        raise ShardError(
            f"parallelism.shard.modules: {unknown} are neither module names nor class names of the "
            f"model (the model itself and parameters are not units); its modules: "
            f"{', '.join(names[:20])}{' ...' if len(names) > 20 else ''}; its classes: {', '.join(classes[:20])}"
        )
    return [m for _, m in sorted(found.items(), key=lambda nm: -nm[0].count("."))]


def shard_model(
    sh: ShardSettings, precision: str, model: nn.Module, mesh: Any, units: list[str], clock: Clock
) -> Stamp:
    """Shard `model` in place over `mesh` (replicate x shard, or shard alone), the named units
    first; the stamp their backward hooks keep. The mesh is on the device the rank bound
    (engine/device.py): its groups are created there."""
    low = LOW.get(precision)
    mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32) if low else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy() if sh.cpu_offload else OffloadPolicy()
    stamp = Stamp(clock)
    # a first unit whose input needs no gradient stamps when its output's gradient is computed: a
    # little early (its own backward follows), which torch warns about on every step
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
    for unit in find_units(model, units):
        fully_shard(
            unit,
            mesh=mesh,
            reshard_after_forward=sh.reshard_after_forward,
            mp_policy=mp,
            offload_policy=offload,
        )
        stamp.watch(unit)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    return stamp


def data_parallel_mesh(mesh: Any, layout: Layout, two_d: bool = False) -> Any:
    """The part of the layout's device mesh (Layout.mesh_dims) that FSDP shards over and averages
    gradients across: the shards together with the named dimensions' ranks, which read the same
    samples and hold the same parameters (TorchTitan's dp_shard_cp), flattened into one dimension;
    with the replica groups outside it (HSDP; `two_d`: even one group, as a pipeline's pieces
    are sharded)."""
    inner = ("shard", *layout.dims)
    name = "shard"
    if len(inner) > 1:
        name = "shard_" + "_".join(layout.dims)
        mesh[inner]._flatten(name)
    return mesh[name] if layout.replicate == 1 and not two_d else mesh["replicate", name]
