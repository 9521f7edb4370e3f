"""Context parallelism on a rank (train/dims.py's RankDimension): the sequence split at the input
of the module the settings name, attention through the group's exchange in every step, the
exchange counted, and sent again alone after training to time it."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.engine.device import current_device, ensure_process_group
from hpctrain.parallel.context.attention import (
    ContextError,
    GatheredAttention,
    ring_attention,
    ring_available,
)
from hpctrain.parallel.context.figures import KEY, ContextStep
from hpctrain.parallel.context.rules import split_at
from hpctrain.parallel.context.zigzag import take

if TYPE_CHECKING:
    from hpctrain.config.schema import Config
    from hpctrain.records import Layout

REFUSED = (nn.MultiheadAttention,)  # attention that does not go through F.scaled_dot_product_attention
Size = tuple[str, tuple[int, ...], torch.dtype]  # ("gather" | "scatter", a share's shape, dtype)


def group_ranks(layout: Layout, rank: int) -> list[int]:
    """The ranks along "cp" with `rank`: all its other coordinates the same."""
    names = list(layout.dims)
    stride = layout.tp * math.prod(layout.dims[n] for n in names[names.index("cp") + 1 :])
    base = rank - layout.dim_of("cp", rank) * stride
    return [base + k * stride for k in range(layout.dims["cp"])]


class ContextSide:
    def __init__(self, cfg: Config, layout: Layout, rank: int) -> None:
        self.cfg, self.layout, self.rank = cfg, layout, rank
        self.n, self.index = layout.dims["cp"], layout.dim_of("cp", rank)
        self.split = split_at(cfg)
        self.group: Any = None
        self.mesh: Any = None  # the group as a 1-D device mesh (torch's ring attention takes one)
        self.device: torch.device | None = None
        self.sizes: list[Size] = []  # this step's collectives of K and V
        self.last: list[Size] = []  # the last whole step's: what figures() sends again
        self.split_off = False  # the check's pass of the model whole

    # --- the model ----------------------------------------------------------------------------
    def wrap(self, module: nn.Module) -> None:
        refused = [n or "the model" for n, m in module.named_modules() if isinstance(m, REFUSED)]
        if refused:
            raise ContextError(
                f"parallelism.cp.degree: {', '.join(refused)} compute{'s' if len(refused) == 1 else ''} attention without "
                "F.scaled_dot_product_attention, which context parallelism splits; call it in your "
                "attention module (torch.nn.functional.scaled_dot_product_attention), or drop parallelism.cp"
            )
        try:
            target = module.get_submodule(self.split)
        except AttributeError:
            names = [n for n, _ in module.named_modules() if n and n.count(".") < 3]
            raise ContextError(
                f"parallelism.cp.split_at: the model has no module {self.split!r}; name the one whose "
                f"input is (batch, sequence, ...), e.g. its first block; its modules: {', '.join(names[:24])}"
            ) from None
        target.register_forward_pre_hook(self._split_input, with_kwargs=True)
        self._make_group()

    def _make_group(self) -> None:
        """Every rank creates every cp group, in the same order (torch.distributed's rule)."""
        self.device = current_device(str(self.cfg.train.device)) if not dist.is_initialized() else None
        if self.device is not None:  # Horovod made none (the memory trace's fake world is one)
            ensure_process_group(self.device, self.cfg.train.stall_timeout_s)
        for r in range(self.layout.world_size):
            if self.layout.dim_of("cp", r) == 0:
                ranks = group_ranks(self.layout, r)
                g = dist.new_group(ranks)
                if self.rank in ranks:
                    self.group = g

    def check(self, module: nn.Module, objective: Any, sample: tuple[torch.Tensor, torch.Tensor]) -> None:
        """One sample's loss with its sequence split over the group against the model whole: the
        same (the group's mean of equal shares' means) unless something after `split_at` sees
        only this rank's share, or nothing there calls F.scaled_dot_product_attention."""
        x, y = sample
        was = module.training
        module.eval()  # dropout would differ between the two passes
        try:
            with torch.no_grad():
                self.split_off = True
                whole = float(objective(module, x, y))
                self.split_off = False
                with self.within():
                    mine = objective(module, x, self.targets(y))
                split = float(self.loss(mine.float()))
        finally:
            module.train(was)
            self.split_off = False
        calls, self.sizes = len(self.sizes), []
        if calls == 0:
            raise ContextError(
                f"parallelism.cp.degree: nothing after {self.split!r} called F.scaled_dot_product_attention, "
                "so attention would see only this rank's share of the sequence; call it in your attention "
                "module, or name in parallelism.cp.split_at a module before it"
            )
        if not math.isclose(split, whole, rel_tol=1e-4, abs_tol=1e-6):
            raise ContextError(
                f"parallelism.cp.degree: one sample's loss is {whole:.6g} with the model whole and {split:.6g} "
                f"with its sequence split over {self.n} ranks at {self.split!r}: something after it sees "
                "only this rank's share of the sequence (positions computed from its length, a mask, a "
                "layer other than F.scaled_dot_product_attention that mixes tokens); compute positions "
                "before that module (a learned table, rotary frequencies given to the blocks), or drop parallelism.cp"
            )

    def _split_input(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self.split_off:
            return None  # the inputs as they are
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[1] % (2 * self.n):
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ContextError(
                f"parallelism.cp.split_at: the input of {self.split!r} is {shape}, not (batch, sequence, "
                f"...) with a sequence of a multiple of {2 * self.n} tokens; name the module whose input that "
                "is (after the embeddings: the first block)"
            )
        return (take(x, self.n, self.index, 1), *args[1:]), kwargs

    # --- every step ---------------------------------------------------------------------------
    def within(self) -> contextlib.AbstractContextManager[None]:
        if self._ring():
            return ring_attention(self.mesh, self._log)
        return _gathered(GatheredAttention(self.group, self.n, self.index, self._log))

    def _ring(self) -> bool:
        """torch's ring attention: on CUDA, where this torch has it (asked once)."""
        if self.mesh is None:
            cuda = self._device().type == "cuda" and ring_available()
            if cuda:
                from torch.distributed.device_mesh import DeviceMesh

                self.mesh = DeviceMesh.from_group(self.group, "cuda")
            else:
                self.mesh = False
        return self.mesh is not False

    def _device(self) -> torch.device:
        if self.device is None:
            self.device = current_device(str(self.cfg.train.device))
        return self.device

    def targets(self, y: Any) -> Any:
        if not isinstance(y, torch.Tensor) or y.dim() < 2 or y.shape[1] % (2 * self.n):
            shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            raise ContextError(
                f"parallelism.cp.degree: the targets are {shape}, not (batch, sequence) with a sequence of "
                f"a multiple of {2 * self.n}: context parallelism splits them as it splits the sequence"
            )
        return take(y, self.n, self.index, 1)

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The mean of the group's (each the mean of an equal share of the sequence's tokens)."""
        whole = loss.detach().clone()
        dist.all_reduce(whole, group=self.group)
        return whole / self.n

    def _log(self, op: str, shape: torch.Size, dtype: torch.dtype) -> None:
        """One collective of K or V (or their gradients): this rank receives the n-1 others'
        shares (a gather) or sends them theirs (a scatter)."""
        self.sizes.append((op, tuple(shape), dtype))

    def step_part(self) -> dict[str, Any]:
        moved = sum((self.n - 1) * math.prod(shape) * dtype.itemsize for _, shape, dtype in self.sizes)
        out = {KEY: ContextStep(exchanges=len(self.sizes), kv_bytes=moved)}
        self.last, self.sizes = self.sizes, []
        return out

    def figures(self) -> dict[str, dict[str, Any]]:
        """The last step's collectives run again alone, each as it ran (collective over the group:
        every rank asks after training)."""
        return {KEY: {"comm_s": replay(self.last, self.n, self.group, self._device())}}


@contextlib.contextmanager
def _gathered(mode: GatheredAttention) -> Iterator[None]:
    with mode:
        yield


def replay(sizes: list[Size], n: int, group: Any, device: torch.device) -> float:
    """Seconds one step's collectives take alone, each as it ran (the best of three, after one to
    warm up)."""
    if not sizes:
        return 0.0
    mine = [(op, torch.zeros(s, dtype=d, device=device).movedim(2, 0).contiguous()) for op, s, d in sizes]
    work = [(op, t, t.new_empty((n * t.shape[0], *t.shape[1:]))) for op, t in mine]
    best = float("inf")
    for i in range(4):
        dist.barrier(group=group)
        start = time.perf_counter()
        for op, t, whole in work:
            if op == "gather":
                dist.all_gather_single(whole, t, group=group)
            else:
                dist.reduce_scatter_single(t, whole, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return best
