"""Reference 3D models: :func:`cosmoflow` (regression), :func:`unet3d` (segmentation) and
:func:`vgg3d` (VGG-like, parameters in large dense layers: the pipeline case)."""
from .cosmoflow import CosmoFlow, cosmoflow
from .unet3d import UNet3D, unet3d
from .vgg3d import VGG3D, vgg3d

__all__ = ["CosmoFlow", "cosmoflow", "UNet3D", "unet3d", "VGG3D", "vgg3d"]
