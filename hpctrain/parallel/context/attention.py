"""How attention sees the whole sequence while each rank holds its share of it.

CPUs (and where torch's ring attention is missing): all-gather K and V over the group, as Llama 3
does (Dubey et al. 2024, section 3.3.2): every rank's queries attend to the gathered keys under the
causal mask of their true positions (zigzag.py); the backward pass reduce-scatters the gathered
keys' and values' gradients to their owners. torch's own context parallelism does not dispatch the
CPU kernel (_scaled_dot_product_flash_attention_for_cpu, torch 2.13), so this is ours.

CUDA: torch's ring attention (torch.distributed.tensor.experimental context parallelism, its
head-tail load balancing, which is our zig-zag), switched on for the step as `context_parallel`
switches it on, without sharding buffers: the sequence was split where the model said."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from hpctrain.errors import HpctrainError


class ContextError(HpctrainError):
    """A model context parallelism cannot split (named with the key and the fix)."""

    quiet = True  # the message names the module, the key and the fix; a rank's stack would not help


# told of each collective of K or V (or their gradients): "gather" forward, "scatter" backward,
# and this rank's share's shape and dtype
Log = Callable[[str, torch.Size, torch.dtype], None]
# torch's own function, kept before ring attention's monkey patch replaces F's attribute
SDPA = F.scaled_dot_product_attention


class _Gather(torch.autograd.Function):
    """The group's shares of a (batch, heads, sequence, dim) tensor, rank after rank along the
    sequence; its gradient reduce-scattered back to each share's rank."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, n: int, log: Log) -> torch.Tensor:
        ctx.group, ctx.n, ctx.log = group, n, log
        log("gather", x.shape, x.dtype)
        local = x.movedim(2, 0).contiguous()  # the collective concatenates along dim 0
        out = local.new_empty((n * local.shape[0], *local.shape[1:]))
        dist.all_gather_single(out, local, group=group)
        return out.movedim(0, 2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        whole = grad.movedim(2, 0).contiguous()
        out = whole.new_empty((whole.shape[0] // ctx.n, *whole.shape[1:]))
        dist.reduce_scatter_single(out, whole, group=ctx.group)
        mine = out.movedim(0, 2)
        ctx.log("scatter", mine.shape, mine.dtype)
        return mine, None, None, None


def gather(x: torch.Tensor, group: Any, n: int, log: Log) -> torch.Tensor:
    return _Gather.apply(x, group, n, log)


class GatheredAttention(TorchFunctionMode):
    """F.scaled_dot_product_attention over the group's gathered K and V (what a step's forward and
    backward run inside on CPUs); every other function as it is. Two ways in, as one: F's
    attribute is replaced for the duration, which is what a block recomputed in the backward pass
    calls (torch function modes are not in force there, and a recomputation that attended
    differently would fail torch's checkpoint check), and the mode catches a call of torch's own
    function bound before (from torch.nn.functional import scaled_dot_product_attention)."""

    def __init__(self, group: Any, n: int, index: int, log: Log) -> None:
        super().__init__()
        self.group, self.n, self.index, self.log = group, n, index, log
        self.inside = 0  # in `attend` through F's attribute: the mode lets its inner call pass

    def __enter__(self) -> GatheredAttention:
        F.scaled_dot_product_attention = self.patched
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        F.scaled_dot_product_attention = SDPA
        super().__exit__(*exc)

    def patched(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.inside += 1
        try:
            return self.attend(*args, **kwargs)
        finally:
            self.inside -= 1

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not SDPA or self.inside:
            return func(*args, **kwargs)
        return self.attend(*args, **kwargs)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        **rest: Any,
    ) -> torch.Tensor:
        if attn_mask is not None:
            raise ContextError(
                "context parallelism splits the sequence; an attention mask of the whole sequence "
                "cannot be split with it (is_causal=True, or no mask, can)"
            )
        keys, values = gather(k, self.group, self.n, self.log), gather(v, self.group, self.n, self.log)
        mask = None
        if is_causal:  # each query sees the keys at its position or before it
            mask = causal_mask(q.shape[-2] * self.n, self.n, self.index).to(q.device)
        return SDPA(q, keys, values, attn_mask=mask, dropout_p=dropout_p, **rest)


class _Counted(TorchFunctionMode):
    """Tells `log` of the K and V each attention call passes around the ring (CUDA), as the
    gathers and scatters they equal: each rank receives the others' shares forward, and their
    gradients go back backward (torch's ring moves K and V, and dK and dV, n-1 times)."""

    def __init__(self, log: Log) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is SDPA and len(args) >= 3:
            for t in args[1:3]:
                local = t.to_local() if hasattr(t, "to_local") else t
                self.log("gather", local.shape, local.dtype)
                self.log("scatter", local.shape, local.dtype)
        return func(*args, **kwargs)


@functools.cache
def causal_mask(seq: int, n: int, index: int) -> torch.Tensor:
    """Which gathered keys rank `index`'s queries see: those at their position or before it."""
    from hpctrain.parallel.context.zigzag import gathered_positions, positions

    return gathered_positions(seq, n)[None, :] <= positions(seq, n, index)[:, None]


def ring_available() -> bool:
    """torch's ring attention, as this torch names it (private: checked, not assumed)."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as ring
    except ImportError:
        return False
    needed = ("_enable_context_parallel_dispatcher_impl", "_disable_context_parallel_dispatcher_impl")
    return all(hasattr(ring, n) for n in needed) and hasattr(ring, "_cp_options")


@contextlib.contextmanager
def ring_attention(mesh: Any, log: Log) -> Iterator[None]:
    """torch's ring attention over the 1-D `mesh` for the duration (CUDA): F.scaled_dot_product_
    attention takes each rank's shares (sequence dimension 2) as a sharded DTensor, the head-tail
    (zig-zag) layout assumed, as `context_parallel` sets it up."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    was = ring._cp_options.enable_load_balance
    ring._dispatch_mode = ring._DispatchMode.MONKEY_PATCH
    ring._cp_options.enable_load_balance = True
    ring._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=mesh)
    try:
        with _Counted(log):
            yield
    finally:
        ring._disable_context_parallel_dispatcher_impl()
        ring._cp_options.enable_load_balance = was
