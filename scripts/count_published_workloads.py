"""Count the workloads of the models in dpteach/measure/data/published.json (FLOPs and bytes per image).

The published measurements ran torchvision's ResNet-50 and ResNet-101 (v1.5: the stride in the 3x3
convolution). torchvision is not a dependency of dpteach, so the two are rebuilt here, and the
rebuilt ResNet-50 is checked against the parameter count torchvision's documentation lists
(ResNet50_Weights.IMAGENET1K_V1: num_params 25557032). Prints the "workload" JSON for one image:

    PYTHONPATH=. python scripts/count_published_workloads.py
"""

from __future__ import annotations

import dataclasses
import json

import torch
from torch import nn

from dpteach.measure.costmodel import workload

RESNET50_PARAMS = 25_557_032  # torchvision docs, resnet50, ResNet50_Weights.IMAGENET1K_V1, num_params


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )  # fmt: skip
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        return torch.relu(self.body(x) + self.down(x))


def resnet(blocks: tuple[int, ...]) -> nn.Module:
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, count in enumerate(blocks):
        width = 64 * 2**i
        for b in range(count):
            layers.append(Bottleneck(cin, width, 2 if (b == 0 and i > 0) else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


def main() -> None:
    torch.set_num_threads(1)
    models = {"resnet50": resnet((3, 4, 6, 3)), "resnet101": resnet((3, 4, 23, 3))}
    params = sum(p.numel() for p in models["resnet50"].parameters())
    assert params == RESNET50_PARAMS, (
        f"rebuilt ResNet-50 has {params} parameters, torchvision's {RESNET50_PARAMS}"
    )
    x = torch.randn(1, 3, 224, 224)
    out = {name: dataclasses.asdict(workload(m, x)) for name, m in models.items()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
