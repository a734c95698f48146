"""Neural-network building blocks over the distributed ops, in PyTorch's style.

``Module``/``Parameter``/``Sequential``/``ModuleList`` (:mod:`.module`), layers
(:mod:`.layers`), the functional namespace (:mod:`.functional`), initializers (:mod:`.init`),
optimizers (:mod:`.optim`), learning-rate schedules (:mod:`.lr_scheduler`), gradient clipping
(:mod:`.utils`), loss scaling for float16 activations (:mod:`.amp`), hybrid sample x spatial
data parallelism (:mod:`.parallel`) and the reference models CosmoFlow and 3D U-Net
(:mod:`.models`).  See ``docs/training.md``.
"""
from . import amp, functional, init, lr_scheduler, models, optim, parallel, partition, utils
from .layers import (ELU, AvgPool1d, AvgPool2d, AvgPool3d, BatchNorm1d, BatchNorm2d,
                     BatchNorm3d, Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d,
                     ConvTranspose3d, CrossEntropyLoss, Dropout, Flatten, Identity, LeakyReLU,
                     Linear, LogSoftmax, MaxPool1d, MaxPool2d, MaxPool3d, MSELoss, ReLU,
                     ScaledTanh, Sigmoid, Softmax, Tanh, Upsample)
from .module import Module, ModuleList, Parameter, Sequential, sequential_layers
from .parallel import DistributedDataParallel, GradientReducer, check_replicas
from .pipeline import Pipeline

__all__ = ["amp", "functional", "init", "lr_scheduler", "models", "optim", "parallel",
           "partition", "utils", "Module", "ModuleList", "Parameter", "Sequential",
           "sequential_layers", "Conv1d", "Conv2d", "Conv3d",
           "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "MaxPool1d", "MaxPool2d",
           "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "BatchNorm1d", "BatchNorm2d",
           "BatchNorm3d", "ReLU", "LeakyReLU", "ELU", "Sigmoid", "Tanh", "ScaledTanh",
           "Softmax", "LogSoftmax", "Dropout", "Flatten", "Linear", "Upsample", "Identity",
           "MSELoss", "CrossEntropyLoss", "DistributedDataParallel", "GradientReducer",
           "check_replicas", "Pipeline"]

from . import backward_update  # noqa: E402  (weight update inside backward)
from .backward_update import BackwardUpdate  # noqa: E402

__all__ += ["backward_update", "BackwardUpdate"]

from . import memory  # noqa: E402  (keep / offload / recompute saved activations)
from .memory import apply_plan, checkpoint, plan_memory, profile_memory  # noqa: E402

__all__ += ["memory", "checkpoint", "profile_memory", "plan_memory", "apply_plan"]

from . import perfmodel  # noqa: E402  (predicted step time per grid, plan_grid)
from .perfmodel import plan_grid  # noqa: E402

__all__ += ["perfmodel", "plan_grid"]

from . import resampling  # noqa: E402  (adaptive pooling, interpolation, padding, Dropout1-3d)
globals().update({_n: getattr(resampling, _n) for _n in resampling.LAYERS})
__all__ += ["resampling"] + resampling.LAYERS

from . import losses  # noqa: E402  (PyTorch's losses, MONAI's Dice/DiceCE, one_hot)
globals().update({_n: getattr(losses, _n) for _n in losses.MODULES})
__all__ += ["losses"] + [_n for _n in losses.MODULES if _n not in __all__]

from . import prune  # noqa: E402  (torch.nn.utils.prune-style pruning, gradual schedule)

__all__ += ["prune"]

from . import normalization  # noqa: E402  (GroupNorm, InstanceNorm1-3d, LayerNorm)
from .normalization import (GroupNorm, InstanceNorm1d, InstanceNorm2d,  # noqa: E402
                            InstanceNorm3d, LayerNorm)

__all__ += ["normalization", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
            "LayerNorm"]

from . import activation  # noqa: E402  (GELU, SiLU, Softplus, Mish, Hardswish, Hardsigmoid, PReLU)
from .activation import (GELU, Hardsigmoid, Hardswish, Mish, PReLU, SiLU,  # noqa: E402
                         Softplus)

__all__ += ["activation", "GELU", "SiLU", "Softplus", "Mish", "Hardswish", "Hardsigmoid",
            "PReLU"]

from . import containers, training_state  # noqa: E402  (ModuleDict, ..., one-call checkpoints)
from .containers import ModuleDict, ParameterDict, ParameterList  # noqa: E402
from .training_state import (TrainingState, load_training_state,  # noqa: E402
                             save_training_state)

__all__ += ["containers", "training_state", "ModuleDict", "ParameterList", "ParameterDict",
            "save_training_state", "load_training_state", "TrainingState"]

from . import sparse_layers  # noqa: E402  (CSB-weight SparseLinear / SparseConv3d, sparsify)
from .sparse_layers import SparseConv3d, SparseLinear, densify, sparsify  # noqa: E402

__all__ += ["sparse_layers", "SparseLinear", "SparseConv3d", "sparsify", "densify"]
