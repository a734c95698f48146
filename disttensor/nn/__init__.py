"""Neural-network building blocks over the distributed ops, in PyTorch's style.

``Module``/``Parameter``/``Sequential``/``ModuleList`` (:mod:`.module`) and the containers
``ModuleDict``/``ParameterList``/``ParameterDict`` (:mod:`.containers`), layers (:mod:`.layers`,
:mod:`.normalization`, :mod:`.activation`, :mod:`.resampling`, :mod:`.losses`), the functional
namespace (:mod:`.functional`), initializers (:mod:`.init`), optimizers (:mod:`.optim`),
learning-rate schedules (:mod:`.lr_scheduler`), gradient clipping (:mod:`.utils`), autocast and
loss scaling (:mod:`.amp`), hybrid sample x spatial data parallelism (:mod:`.parallel`),
one-call training checkpoints (:mod:`.training_state`), pruning and sparse layers
(:mod:`.prune`, :mod:`.sparse_layers`) and the reference models (:mod:`.models`).  See
``docs/training.md``.
"""
from . import functional  # first: normalization and activation build on its helpers
from . import (activation, amp, containers, init, layers, losses, lr_scheduler, models,  # noqa
               normalization, optim, parallel, partition, resampling, training_state, utils)
from .activation import GELU, Hardsigmoid, Hardswish, Mish, PReLU, SiLU, Softplus
from .containers import ModuleDict, ParameterDict, ParameterList
from .layers import *  # noqa: F403  (every layer class: layers.__all__)
from .module import Module, ModuleList, Parameter, Sequential, sequential_layers
from .normalization import GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, LayerNorm
from .parallel import DistributedDataParallel, GradientReducer, check_replicas
from .pipeline import Pipeline
from .training_state import TrainingState, load_training_state, save_training_state

__all__ = ["activation", "amp", "containers", "functional", "init", "layers", "losses",
           "lr_scheduler", "models", "normalization", "optim", "parallel", "partition",
           "resampling", "training_state", "utils", "Module", "ModuleList", "Parameter",
           "Sequential", "sequential_layers", "ModuleDict", "ParameterList", "ParameterDict",
           "GELU", "SiLU", "Softplus", "Mish", "Hardswish", "Hardsigmoid", "PReLU",
           "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm",
           "DistributedDataParallel", "GradientReducer", "check_replicas", "Pipeline",
           "save_training_state", "load_training_state", "TrainingState"]
__all__ += layers.__all__

from . import backward_update  # noqa: E402  (weight update inside backward)
from .backward_update import BackwardUpdate  # noqa: E402

__all__ += ["backward_update", "BackwardUpdate"]

from . import memory  # noqa: E402  (keep / offload / recompute saved activations)
from .memory import apply_plan, checkpoint, plan_memory, profile_memory  # noqa: E402

__all__ += ["memory", "checkpoint", "profile_memory", "plan_memory", "apply_plan"]

from . import perfmodel  # noqa: E402  (predicted step time per grid, plan_grid)
from .perfmodel import plan_grid  # noqa: E402

__all__ += ["perfmodel", "plan_grid"]

from . import prune  # noqa: E402  (torch.nn.utils.prune-style pruning, gradual schedule)
from . import sparse_layers  # noqa: E402  (CSB-weight SparseLinear / SparseConv3d, sparsify)
from .sparse_layers import SparseConv3d, SparseLinear, densify, sparsify  # noqa: E402

__all__ += ["prune", "sparse_layers", "SparseLinear", "SparseConv3d", "sparsify", "densify"]
