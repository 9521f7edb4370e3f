"""One rank's memory over a training step, traced without allocating anything: the model is built
under FakeTensorMode, split and sharded by the same wrappers the ranks use (parallel/tensor/split.py,
engine/fsdp_wrap.py) over a fake process group of the run's world size (torch's FakeStore, as
TorchTitan's memory estimation does), and two steps run under torch's memory tracker (MemTracker;
FSDPMemTracker where FSDP shards); the peak is the tracker's, by category. A pipeline stage runs
as many micro-batches' forwards before their backwards as its schedule keeps in flight."""

from __future__ import annotations

import contextlib
import fnmatch
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.config.derived import Derived
from hpctrain.config.layout import SCHEDULES
from hpctrain.config.schema import Config
from hpctrain.config.split import (
    chain_pieces,
    declared_chain,
    declared_checkpoint_blocks,
    split_points,
    units_within,
)
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.memory.follow import cannot_follow, following, unfollowed
from hpctrain.parallel.dimensions import layer_split, rank_sides
from hpctrain.records import Layout
from hpctrain.train.dims import LayerSplit, RankDimension, targets, within
from hpctrain.train.memory import local_bytes
from hpctrain.train.objective import Objective

# the trackers' categories, as the prediction's parts name them
CATEGORY = {
    "Parameter": "params",
    "Buffer": "params",
    "Sharded Param": "params",
    "Unsharded Param": "params",
    "Gradient": "grads",
    "Sharded Grad": "grads",
    "Unsharded Grad": "grads",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Inputs": "activations",
    "Other": "activations",
    "All Gather": "buffers",
    "Reduce Scatter": "buffers",
}


class TraceError(HpctrainError):
    """The model or its data could not be traced (the message says what and why)."""


@dataclass(frozen=True)
class Traced:
    """The tracker's peak by part (bytes), the dataset's bytes in the rank's process, and the
    bytes of the trainable parameters the rank holds (what its gradients come to once all are
    computed: DDP's buckets copy them)."""

    parts: dict[str, int]
    data: int
    trainable: int


@contextlib.contextmanager
def fake_world(world: int, rank: int) -> Iterator[None]:
    """A process group of `world` ranks that moves nothing (this process plays `rank`)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise TraceError("memory is traced outside training: this process already has a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _meshes(layout: Layout) -> dict[str, Any]:
    """The engine's mesh (engine/ddp.py: device_mesh) and its slices, taken outside fake mode:
    slicing computes coordinates from a real tensor."""
    from torch.distributed.device_mesh import init_device_mesh

    from hpctrain.engine.fsdp_wrap import data_parallel_mesh

    dims = layout.mesh_dims
    mesh = init_device_mesh("cpu", tuple(n for _, n in dims), mesh_dim_names=tuple(d for d, _ in dims))
    return {"tp": mesh["tp"], "dp": data_parallel_mesh(mesh, layout)}


def _segments(cfg: Config, layout: Layout) -> list[list[str]]:
    """The model's chain of modules cut into the layout's pieces (config/split.py)."""
    chain = declared_chain(cfg.model)
    if not chain:
        raise TraceError(
            "a pipeline's memory is traced along the model's chain of modules, which this model does not "
            "declare (model.chain)"
        )
    return chain_pieces(chain, split_points(cfg, layout.pieces))


def _pieces(
    cfg: Config, layout: Layout, whole: nn.Module, x: torch.Tensor, rank: int
) -> tuple[list[nn.Module], list[int], list[torch.Tensor]]:
    """The modules the rank holds, their positions in the chain and their inputs (the whole
    model: [0] and the batch)."""
    if not layout.pipelined:
        return [whole], [0], [x]
    from hpctrain.train.modules import ChainPiece

    segments = _segments(cfg, layout)
    mine = layout.pieces_of(rank)
    pieces: list[nn.Module] = [ChainPiece(whole, segments[k]) for k in mine]
    return pieces, mine, _piece_inputs(segments, whole, mine, x)


def _wrap(
    cfg: Config, layout: Layout, piece: nn.Module, meshes: dict[str, Any], how: LayerSplit | None
) -> None:
    """What the rank's build does to a piece: split it (TP), recompute its blocks, shard it."""
    from hpctrain.engine.clock import HostClock
    from hpctrain.engine.fsdp_wrap import shard_model
    from hpctrain.train.modules import checkpoint_blocks

    names = [n for n, _ in piece.named_modules() if n]
    if how is not None:
        how.split(piece, meshes, whole=False)
    if cfg.model.activation_checkpointing:  # the blocks (or patterns: transformer.h.*) this piece holds
        blocks = declared_checkpoint_blocks(cfg.model)
        checkpoint_blocks(piece, [b for b in blocks if any(fnmatch.fnmatchcase(n, b) for n in names)])
    if layout.shard > 1:
        units = units_within(cfg.model, list(cfg.parallelism.shard.modules), set(names))
        shard_model(cfg.parallelism.shard, cfg.precision.name, piece, meshes["dp"], units, HostClock())


def _batch(cfg: Config, micro: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A micro-batch of the run's data (fake), and the bytes of the dataset a rank builds."""
    from hpctrain.train.parts import make_dataset

    try:
        dataset = make_dataset(cfg, micro)
        x, y = dataset[0]
    except Exception as e:  # a user's dataset: whatever it raises, the trace cannot go on
        raise TraceError(f"the data could not be traced: {type(e).__name__}: {e}") from e
    held = sum(int(t.numel() * t.element_size()) for t in getattr(dataset, "tensors", ()))
    return torch.stack([x] * micro), torch.stack([y] * micro), held


def trace_rank(cfg: Config, d: Derived, rank: int) -> Traced:
    """`rank`'s peak over a training step, traced."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hpctrain.train.parts import make_objective
    from hpctrain.train.setup import make_optimizer

    layout = d.layout
    with fake_world(layout.world_size, rank), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshes = _meshes(layout)
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        with fake:
            whole, x, y, held = _built(cfg, d.batch.micro)
            if cfg.user_code:
                fits(cfg, whole, x, y)
        try:
            dims = rank_sides(cfg, layout, rank)  # as the ranks' build: before the pieces are cut
            for side in dims:
                side.wrap(whole)
            with fake:
                pieces, at, inputs = _pieces(cfg, layout, whole, x, rank)
            how = layer_split(cfg, layout)
            for piece in pieces:
                _wrap(cfg, layout, piece, meshes, how)
            if cfg.user_code and how is not None and not layout.pipelined:  # as the ranks check it
                with fake:
                    fits(cfg, pieces[0], x, y, how)
            with fake:
                optimizer = make_optimizer(cfg, nn.ModuleList(pieces), d.lr)
                step = Step(pieces, at, inputs, targets(dims, y), make_objective(cfg), dims)
                parts = _track(cfg, layout, optimizer, step, layout.stage_of(rank))
                trainable = sum(
                    local_bytes(q) for piece in pieces for q in piece.parameters() if q.requires_grad
                )
        except HpctrainError:
            raise
        except Exception as e:  # noqa: BLE001 - a model the tracer cannot follow: not predicted, said why
            raise TraceError(f"the step could not be traced: {type(e).__name__}: {_first_line(e)}") from e
    return Traced(parts, held, trainable)


def _built(cfg: Config, micro: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    """The model and a micro-batch, fake; a user's constructor that fails here (a file only the
    nodes have, a value fake tensors lack, its own bug) leaves the memory unpredicted: the ranks
    build it and report what it raises."""
    from hpctrain.train.parts import make_model
    from hpctrain.train.targets import WorkloadError

    try:
        whole = make_model(cfg)
    except WorkloadError as e:
        raise TraceError(f"{e}; the ranks build it (and say so if it fails there too)") from e
    return (whole, *_batch(cfg, micro))


def fits(
    cfg: Config, model: nn.Module, x: torch.Tensor, y: torch.Tensor, split: LayerSplit | None = None
) -> None:
    """One sample of the user's data through the user's model and loss, on fake tensors: where
    they do not fit, the problem the ranks would report after the start (train/targets.py:probe)
    is refused now, as a ConfigError (exit 2); `split`: what split the model (tensor
    parallelism), checked once split as the ranks check it. What fake tensors cannot
    follow (a value read in forward) only leaves the memory unpredicted."""
    from hpctrain.train.parts import make_objective, workload_label
    from hpctrain.train.targets import WorkloadError, probe

    what = f"{workload_label(cfg)} split by {split.key}" if split else workload_label(cfg)
    try:
        with following(model) as where:
            probe(
                model,
                make_objective(cfg),
                [(x[0], y[0])],
                torch.device("cpu"),
                what,
                split.hint if split else "",
            )
    except WorkloadError as e:
        if cannot_follow(e):  # a value read in forward, NumPy, storage: the ranks run it
            raise TraceError(unfollowed(e, where)) from e
        sections = [s for s in ("model", "loss", "data") if getattr(cfg, s)._target_]
        raise ConfigError.one(
            split.key if split else f"{sections[0] if sections else 'model'}._target_",
            str(e),
            "make the model, its data and the loss fit (docs: tutorials/own-code, the model's contract); "
            "a model that computes its own loss trains with loss=model",
        ) from e


def check_workload(cfg: Config) -> None:
    """fits() outside a trace (hpctrain tune, before its trials): ConfigError where the user's
    model, data and loss do not fit; nothing where they fit or cannot be built here."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hpctrain.train.parts import make_model

    try:
        with warnings.catch_warnings(), FakeTensorMode(allow_non_fake_inputs=True):
            warnings.simplefilter("ignore")
            model = make_model(cfg)
            x, y, _ = _batch(cfg, 1)
            fits(cfg, model, x, y)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - not buildable here (its data on other nodes): the trials will tell
        return


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


@dataclass(frozen=True)
class Step:
    """What one traced step runs: the rank's pieces, their inputs, the labels and the loss."""

    pieces: list[nn.Module]
    at: list[int]  # each piece's position in the chain
    inputs: list[torch.Tensor]
    y: torch.Tensor
    objective: Objective  # the loss after the head (train/objective.py)
    dims: tuple[RankDimension, ...] = ()  # the layout's named dimensions' rank sides (train/dims.py)


def _piece_inputs(
    segments: list[list[str]], whole: nn.Module, at: list[int], x: torch.Tensor
) -> list[torch.Tensor]:
    """What each piece takes: the first the batch, the others what the chain before them makes of
    it (fake: shapes only, before anything is split or sharded)."""
    out = []
    for k in at:
        h = x
        with torch.no_grad():
            for name in (n for seg in segments[:k] for n in seg):
                h = whole.get_submodule(name)(h)
        out.append(h if k == 0 else torch.empty_like(h).requires_grad_(True))
    return out


class _Forwards(nn.Module):
    """One step's forwards as one call: the trackers take a root module's second call for the next
    iteration, and a stage runs its pieces once per micro-batch in flight."""

    def __init__(self, step: Step, flight: int, precision: str, last: int) -> None:
        super().__init__()
        self.pieces = nn.ModuleList(step.pieces)
        self.step, self.flight, self.precision, self.last = step, flight, precision, last

    def forward(self) -> list[torch.Tensor]:
        """What the backward starts from: the loss after the head, a stage's output elsewhere."""
        from hpctrain.train.precision import autocast

        outs = []
        for _ in range(self.flight):
            for k, piece, x in zip(self.step.at, self.pieces, self.step.inputs):
                with autocast(self.precision, "cpu"), within(self.step.dims):
                    if k == self.last:  # the head's piece: called as a step calls the model
                        args, kwargs = self.step.objective.inputs(x, self.step.y)
                        out = self.step.objective.stage_loss(_whole(piece(*args, **kwargs)), self.step.y)
                    else:
                        out = _whole(piece(x))
                outs.append(out)
        return outs


def _track(cfg: Config, layout: Layout, optimizer: Any, step: Step, stage: int) -> dict[str, int]:
    """The tracker's peak over two steps, by part."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    schedule = SCHEDULES[cfg.parallelism.schedule] if layout.pipelined else None
    flight = schedule.in_flight(layout.stages, cfg.parallelism.microbatches, stage) if schedule else 1
    # the piece with the head, whose output the loss takes
    forwards = _Forwards(step, flight, cfg.precision.name, last=layout.pieces - 1)
    tracker: Any
    if layout.shard > 1 and len(step.pieces) == 1:
        tracker = FSDPMemTracker(step.pieces[0], optimizer)  # tells the all-gathered units apart
    else:
        tracker = MemTracker()
        tracker.track_external(forwards, optimizer)
    with tracker:
        for _ in range(2):  # the second step has the optimizer's state
            for out in forwards():
                with within(step.dims):
                    out.backward(torch.ones_like(out) if out.dim() else None)
            optimizer.step()
            optimizer.zero_grad()
            tracker.reset_mod_stats()
    snap = tracker.get_tracker_snapshot("peak")
    parts = dict.fromkeys(("params", "grads", "optimizer", "activations", "buffers"), 0)
    for by in snap.values():
        for key, n in by.items():
            name = CATEGORY.get(getattr(key, "value", str(key)))
            if name is not None:
                parts[name] += int(n)
    return parts


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a split head's output, as the loss takes it), else the tensor."""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t
