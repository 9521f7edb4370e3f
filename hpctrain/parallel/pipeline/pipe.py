"""Pipeline and hybrid parallelism on the ranks, with torch.distributed.pipelining: the model is
traced and cut at the split points (pipeline()), each rank runs its pieces as PipelineStages, and
a library schedule (GPipe, 1F1B, interleaved 1F1B) moves micro-batch activations and gradients
between neighbours point to point. The replicas of a stage average its gradients through the
engine (Horovod process sets, or DDP over the stage's process group).

Timing: the stages' forward_one_chunk / backward_one_chunk calls are this rank's compute; the
schedule's waits on its sends and receives are the transfers and the idle time (the bubble),
split by the link's measured α–β (p2p.py); the rest of its wall time is its own overhead.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.config.layout import SCHEDULES, Layout
from hpctrain.config.schema import Config
from hpctrain.config.split import split_points
from hpctrain.engine.clock import Clock, Mark, clock_for
from hpctrain.engine.ties import PipelineTies, pipeline_ties, retie, tied_groups
from hpctrain.parallel.pipeline.p2p import Meter, install, measure_link
from hpctrain.train.modules import SplitError
from hpctrain.train.objective import Objective

# what the model is called with on one micro-batch: positional and keyword arguments
Example = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass
class Tally:
    """This rank's compute within the current step: the clock's marks around each of its pieces'
    forward and backward chunks, summed once the step has settled."""

    clock: Clock
    spans: list[tuple[Mark, Mark]] = field(default_factory=list)
    backward_end: Mark | None = None  # when the latest backward chunk ended
    delay_s: float = 0.0  # debug.slow_rank: sleep before each backward chunk (a slow stage, for tests)

    def reset(self) -> None:
        self.spans.clear()
        self.backward_end = None

    def compute_s(self) -> float:
        return sum(self.clock.seconds(a, b) for a, b in self.spans)


@dataclass
class Pipe:
    schedule: Any
    layout: Layout
    rank: int
    group: Any  # this replica's pipeline (torch.distributed process group)
    last_rank: int  # global rank holding this pipeline's last piece: it computes the loss
    meter: Meter
    tally: Tally
    # loss=model: the forward's name for the targets, which every rank passes to its schedule as
    # a keyword (each piece keeps the keywords it takes: the one that computes the loss)
    targets_kw: str | None = None

    @property
    def stage(self) -> int:
        return self.layout.stage_of(self.rank)

    @property
    def replica(self) -> int:
        return self.layout.replica_of(self.rank)

    @property
    def first(self) -> bool:
        return self.layout.stage_of(self.rank) == 0

    @property
    def last(self) -> bool:
        return self.rank == self.last_rank


def make_groups(layout: Layout, rank: int) -> tuple[Any, Any]:
    """(this rank's pipeline group, its stage's replica group). Every rank creates every group in
    the same order, as torch.distributed.new_group requires."""
    pp = dp = None
    for r in range(layout.replicas):
        g = dist.new_group(layout.pipeline_ranks(r))
        if rank in layout.pipeline_ranks(r):
            pp = g
    for s in range(layout.stages):
        g = dist.new_group(layout.replica_ranks(s))
        if rank in layout.replica_ranks(s):
            dp = g
    return pp, dp


def cut(cfg: Config, module: nn.Module, layout: Layout, example: Example) -> list[nn.Module]:
    """Every piece of the model, traced on one micro-batch of the real shape (the traced graph is
    specialised to it), called as a step calls it (`example`: its positional and keyword
    arguments; with loss=model the targets too, which the tracer passes straight to the piece that
    takes them). Parameters keep their names in the whole model (checkpoints match)."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    names = split_points(cfg, layout.pieces)
    known = {n for n, _ in module.named_modules()}
    unknown = [n for n in names if n not in known]
    if unknown:
        some = ", ".join(n for n, _ in list(module.named_modules())[1:12])
        raise SplitError(
            f"parallelism.split_at: {unknown} are not modules of the model; its modules include {some}, ..."
        )
    try:
        with warnings.catch_warnings():
            # torch.export's own pytree code deprecates what it calls itself (torch 2.13): not the
            # user's to act on, so not on their console
            warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec", category=FutureWarning)
            pipe = pipeline(
                module,
                mb_args=example[0],
                mb_kwargs=example[1] or None,
                split_spec={n: SplitPoint.BEGINNING for n in names},
            )
    except Exception as e:  # noqa: BLE001 - tracing fails in many ways; all mean "cannot cut here"
        raise SplitError(
            f"the model cannot be traced for a pipeline (torch.export): {type(e).__name__}: {str(e)[:500]}"
        ) from e
    if pipe.num_stages != layout.pieces:
        raise SplitError(
            f"cutting at {names} gave {pipe.num_stages} pieces, not {layout.pieces}: list the split "
            "points in forward order, each where a module is first called"
        )
    return [pipe.get_stage_module(k) for k in range(layout.pieces)]


def _only_its_keywords(piece: nn.Module) -> None:
    """`piece` called with only the keyword arguments its forward takes (a traced piece's: the
    values it receives). Every rank passes the targets (loss=model) to all its pieces, whatever
    calls them (the stage's chunks, a schedule's shape inference, DDP's wrapper), and only the
    piece that computes the loss takes them. Set on the instance: not the class's forward."""
    import inspect

    forward = piece.forward
    takes = set(inspect.signature(forward).parameters)

    def call(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **{k: v for k, v in kwargs.items() if k in takes})

    vars(piece)["forward"] = call


def _keeps_buffers(stage: Any, module: nn.Module) -> None:
    """The stage's shape inference (torch 2.13 runs the piece's forward once, before the first
    micro-batch, on the first stage's real input and on empty tensors elsewhere) leaves the
    piece's buffers as they were: a BatchNorm's running statistics took that forward as a batch
    (measured: 26 % off one rank's, the weights equal). A torch without the method keeps its own."""
    infer = getattr(stage, "_prepare_forward_infra", None)
    if infer is None:
        return

    def call(*args: Any, **kwargs: Any) -> Any:
        kept = {name: b.detach().clone() for name, b in module.named_buffers()}
        try:
            return infer(*args, **kwargs)
        finally:
            with torch.no_grad():
                for name, b in module.named_buffers():
                    b.copy_(kept[name])

    vars(stage)["_prepare_forward_infra"] = call


def _timed(fn: Callable[..., Any], tally: Tally, backward: bool, delay: bool = True) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        start = tally.clock.mark()
        if backward and delay and tally.delay_s:
            time.sleep(tally.delay_s)
        try:
            return fn(*args, **kwargs)
        finally:
            end = tally.clock.mark()
            tally.spans.append((start, end))
            if backward:
                tally.backward_end = end

    return call


def build_pipe(
    cfg: Config,
    pieces: list[nn.Module],
    layout: Layout,
    rank: int,
    device: torch.device,
    group: Any,
    objective: Objective,
    targets_kw: str | None = None,
    delay_s: float = 0.0,
) -> Pipe:
    """This rank's stages (its pieces, engine-wrapped) under the configured schedule, its waits
    metered against the link to its neighbours (measured here: every rank of the pipeline calls
    this)."""
    from torch.distributed import pipelining

    ranks = layout.pipeline_of(rank)
    clock = clock_for(device)
    meter = Meter(measure_link(ranks, rank, group, device, clock))
    install(meter, clock)
    # the rank holding the last piece computes the loss: the last stage, or under zbv's V the first
    last = next(r for r in ranks if layout.pieces - 1 in layout.pieces_of(r))
    pipe = Pipe(None, layout, rank, group, last, meter, Tally(clock, delay_s=delay_s), targets_kw)
    stages: list[Any] = []
    for module, k in zip(pieces, layout.pieces_of(rank)):
        stage = pipelining.PipelineStage(module, k, layout.pieces, device, group=group)
        # this stage's bound methods, timed: set on the instance (its __dict__), not the class.
        # Zero-bubble schedules split the backward: input gradients, then weight gradients.
        vars(stage)["forward_one_chunk"] = _timed(stage.forward_one_chunk, pipe.tally, backward=False)
        vars(stage)["backward_one_chunk"] = _timed(stage.backward_one_chunk, pipe.tally, backward=True)
        vars(stage)["backward_weight_one_chunk"] = _timed(
            stage.backward_weight_one_chunk, pipe.tally, backward=True, delay=False
        )
        _keeps_buffers(stage, module)
        stages.append(stage)
    m = cfg.parallelism.microbatches

    # The loss of a micro-batch is divided by their number here, not by the schedule after the
    # backward passes (scale_grads): Horovod may already be averaging those gradients by then.
    def loss_fn(out: Any, target: torch.Tensor) -> torch.Tensor:
        return objective.stage_loss(out, target) / m

    kind = SCHEDULES[str(cfg.parallelism.schedule)]
    cls = getattr(pipelining, kind.torch_class)
    pipe.schedule = cls(stages if kind.multi else stages[0], m, loss_fn=loss_fn, scale_grads=False)
    return pipe


def pieces_for(
    cfg: Config,
    module: nn.Module,
    layout: Layout,
    rank: int,
    example: Example,
    device: torch.device,
) -> tuple[list[nn.Module], PipelineTies]:
    """This rank's pieces of the model, on the device, with activation checkpointing if asked;
    and its copies of the tied parameters that more than one piece holds (engine/ties.py)."""
    ties = tied_groups(module)
    every = cut(cfg, module, layout, example)  # once: tracing a module twice fails
    for piece in every:  # the tracer leaves a piece a copy per name of a tie: one again
        retie(piece, ties, "the pipeline's cut")
        _only_its_keywords(piece)
    held = {k: every[k].to(device) for k in layout.pieces_of(rank)}
    spans = pipeline_ties(
        ties, [{n for n, _ in p.named_parameters(remove_duplicate=False)} for p in every], held, layout, rank
    )
    mine = list(held.values())
    if cfg.model.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        mine = [checkpoint_wrapper(p) for p in mine]  # the piece keeps only its input per micro-batch
    return mine, spans


class StageWeights:
    """This rank's pieces as checkpoints see them: a state dict keyed by the whole model's
    parameter names (a pipeline checkpoint holds the whole model, gathered from the stages)."""

    def __init__(self, pieces: list[nn.Module]) -> None:
        self.pieces = pieces

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.pieces:
            out.update(_unwrapped(p).state_dict())
        return out

    def load_state_dict(self, full: dict[str, Any]) -> None:
        for p in self.pieces:
            m = _unwrapped(p)
            missing = [k for k in m.state_dict() if k not in full]
            if missing:
                raise KeyError(f"the checkpoint has no {missing[:3]}")
            m.load_state_dict({k: full[k] for k in m.state_dict()})

    def parameters(self) -> list[nn.Parameter]:
        return [q for p in self.pieces for q in p.parameters()]


class StageOptimizer:
    """The optimizer of this rank's stage as checkpoints see it: the checkpoint holds every
    stage's optimizer state, keyed by stage (replicas of a stage hold the same state)."""

    def __init__(self, optimizer: Any, stage: int) -> None:
        self.optimizer, self.stage = optimizer, stage

    def state_dict(self) -> dict[str, Any]:
        return {"stages": {self.stage: self.optimizer.state_dict()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        stages = state.get("stages", {}) if isinstance(state, dict) else {}
        if self.stage not in stages:
            raise KeyError(
                f"no optimizer state for pipeline stage {self.stage} (a checkpoint of another layout?)"
            )
        self.optimizer.load_state_dict(stages[self.stage])


def _unwrapped(p: nn.Module) -> nn.Module:
    """Without DDP's wrapper (checkpoint_wrapper strips its own prefix from state dicts)."""
    return p.module if isinstance(p, nn.parallel.DistributedDataParallel) else p


def merge_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's checkpoint from every rank's {"model", "optimizer"} states (allgathered)."""
    model: dict[str, Any] = {}
    stages: dict[int, Any] = {}
    for s in states:
        model.update(s["model"])
        stages.update(s["optimizer"]["stages"])
    return {"model": model, "optimizer": {"stages": stages}}
