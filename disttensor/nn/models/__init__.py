"""Reference 3D models: :func:`cosmoflow` (regression), :func:`unet3d` (segmentation) and
:func:`vgg3d` (VGG-like, parameters in large dense layers: the pipeline case),
:func:`nnunet3d` (nnU-Net's plain U-Net: instance norm, strided convolutions, deep
supervision) and :func:`resnet3d` (3D ResNet, basic or bottleneck blocks)."""
from .cosmoflow import CosmoFlow, cosmoflow
from .nnunet import DeepSupervisionLoss, NNUNet3D, deep_supervision_weights, nnunet3d
from .resnet3d import (BasicBlock, Bottleneck, ResNet3D, resnet3d, resnet18_3d,
                       resnet50_3d)
from .unet3d import UNet3D, unet3d
from .vgg3d import VGG3D, vgg3d

__all__ = ["CosmoFlow", "cosmoflow", "UNet3D", "unet3d", "VGG3D", "vgg3d", "NNUNet3D",
           "nnunet3d", "DeepSupervisionLoss", "deep_supervision_weights", "ResNet3D",
           "resnet3d", "resnet18_3d", "resnet50_3d", "BasicBlock", "Bottleneck"]
