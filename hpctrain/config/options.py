"""The option sets of the configuration: one StrEnum per closed choice, and the groups of models
and datasets that go together. The schema (schema.py) types its fields with these."""

from __future__ import annotations

from enum import StrEnum

# The option sets. OmegaConf accepts a member by its name, so every name equals its value; a
# StrEnum compares equal to its string, so code and records keep using plain strings.


class Model(StrEnum):
    cnn = "cnn"
    mlp = "mlp"
    resnet18 = "resnet18"
    resnet50 = "resnet50"
    transformer = "transformer"


class Dataset(StrEnum):
    synthetic = "synthetic"
    tokens = "tokens"
    digits = "digits"
    folder = "folder"


class Precision(StrEnum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"


# Pipeline schedules: gpipe, all forwards then all backwards (Huang et al. 2019); 1f1b, one
# forward and one backward in the steady state (PipeDream-Flush, Narayanan et al. 2021);
# interleaved_1f1b, several model pieces per rank (Narayanan et al. 2021); interleaved_zb and
# zbv, zero bubble: the backward split into input and weight gradients, the weight gradients
# filling the bubble (Qi et al. 2024, ZB-H1 looped and ZB-V). What each needs: config/layout.py.
# The functional form because OmegaConf parses enums by member name and "1f1b" is no identifier.
Schedule = StrEnum(
    "Schedule",
    [
        ("gpipe", "gpipe"),
        ("1f1b", "1f1b"),
        ("interleaved_1f1b", "interleaved_1f1b"),
        ("interleaved_zb", "interleaved_zb"),
        ("zbv", "zbv"),
    ],
)


class Backend(StrEnum):
    mpi = "mpi"
    gloo = "gloo"


class Compression(StrEnum):
    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"  # ddp only (a communication hook); Horovod has no bf16 compressor


class Optimizer(StrEnum):  # torch.optim's classes of the same names (train/optim.py)
    sgd = "sgd"
    adam = "adam"
    adamw = "adamw"
    adagrad = "adagrad"
    rmsprop = "rmsprop"


# the optim.* keys each built-in optimizer reads besides lr: its keyword arguments of the same names
OPTIM_READS: dict[str, tuple[str, ...]] = {
    "sgd": ("momentum", "nesterov", "weight_decay"),
    "adam": ("betas", "eps", "weight_decay"),
    "adamw": ("betas", "eps", "weight_decay"),
    "adagrad": ("eps", "weight_decay"),
    "rmsprop": ("alpha", "eps", "momentum", "weight_decay"),
}


class LossKind(StrEnum):
    cross_entropy = "cross_entropy"  # the trainer's cross-entropy (or loss._target_) over the model's output
    model = "model"  # the model computes its own loss: forward(inputs, targets) returns it


class LrScaling(StrEnum):
    none = "none"
    linear = "linear"


class ElasticKeeps(StrEnum):
    """What an elastic restart on fewer ranks keeps (train.elastic_keeps)."""

    global_batch = "global_batch"  # each rank takes a larger share; the learning rate is unchanged
    batch_per_rank = "batch_per_rank"  # the global batch shrinks; optim.lr_scaling rescales the lr


class CompileMode(StrEnum):
    """torch.compile's modes (train.compile_mode)."""

    default = "default"
    reduce_overhead = "reduce-overhead"  # CUDA graphs where they apply
    max_autotune = "max-autotune"
    max_autotune_no_cudagraphs = "max-autotune-no-cudagraphs"


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class FailMode(StrEnum):
    exception = "exception"
    kill = "kill"
    start_segfault = "start_segfault"


class StudyKind(StrEnum):
    strong = "strong"
    weak = "weak"


class RankStarter(StrEnum):  # how local ranks start (launch/local/plan.py)
    auto = "auto"  # mpirun where it is found or needed, else spawn
    mpirun = "mpirun"
    spawn = "spawn"  # one process per rank, as torchrun starts them: no MPI


class MpiPlugin(StrEnum):  # srun --mpi=...
    pmix = "pmix"
    pmix_v4 = "pmix_v4"
    pmix_v3 = "pmix_v3"
    pmi2 = "pmi2"
    none = "none"


IMAGE_MODELS = (Model.cnn, Model.mlp, Model.resnet18, Model.resnet50)
TOKEN_MODELS = (Model.transformer,)
IMAGE_DATASETS = (Dataset.synthetic, Dataset.digits, Dataset.folder)
# data=digits trains on the first 1437 of its 1797 samples (a fixed shuffle); 360 are held out
DIGITS_TRAIN = 1437
TOKEN_DATASETS = (Dataset.tokens,)
