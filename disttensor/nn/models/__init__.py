"""Reference 3D models: :func:`cosmoflow` (regression) and :func:`unet3d` (segmentation)."""
from .cosmoflow import CosmoFlow, cosmoflow
from .unet3d import UNet3D, unet3d

__all__ = ["CosmoFlow", "cosmoflow", "UNet3D", "unet3d"]
