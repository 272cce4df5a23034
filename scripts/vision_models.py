"""torchvision's and timm's models on 2 and 3 CPU slots, against what DataParallel should compute.

    python scripts/vision_models.py [--steps 3]

Needs torchvision and timm, which the test extras do not install (tests/core/test_real_models.py runs
transformers' models in the suite). PyPI's torchvision wheel is a CUDA build: its C++ operators
(nms, roi_align) cannot load beside PyTorch's CPU build, and its ``_meta_registrations`` module
fails on import for want of them. The models are plain Python and use none of those operators, so
this script skips that one module when the operators are missing.

The reference is what DataParallel means, computed on one device: each slot's rows run through a
copy of the model of their own (so BatchNorm in train mode normalises each slot's rows by their own
statistics, as on separate GPUs), the outputs are concatenated, and the copies' gradients summed;
the running statistics kept are slot 0's under "broadcast" (torch's), none under "rewire" (C++'s). For every
model, slot count and strategy, over ``--steps`` SGD steps: the output (every tensor of a nested
output), every parameter's gradient, the parameters after the step and the buffers must match.
Dropout and stochastic depth are off (a slot's mask cannot match another run's). Prints one line per
case and exits 1 if any case differs.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
import types

import torch

from dpteach.data_parallel import DataParallel


def _import_torchvision():
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as exc:  # "operator torchvision::nms does not exist": a CUDA wheel on CPU torch
        if "torchvision::" not in str(exc):
            raise
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        return importlib.import_module("torchvision")


def models():
    tv = _import_torchvision()
    import timm

    vit = tv.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5
    )
    yield "torchvision resnet18", tv.models.resnet18(num_classes=5), torch.randn(6, 3, 32, 32)
    yield (
        "torchvision mobilenet_v3_small",
        tv.models.mobilenet_v3_small(num_classes=5, dropout=0.0),
        torch.randn(6, 3, 32, 32),
    )
    yield "torchvision vit (2 layers)", vit, torch.randn(6, 3, 32, 32)
    yield (
        "timm vit_tiny (2 layers)",
        timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=5),
        torch.randn(6, 3, 32, 32),
    )
    yield (
        "timm mobilenetv3_small_050",
        timm.create_model("mobilenetv3_small_050", num_classes=5, drop_rate=0.0),
        torch.randn(6, 3, 32, 32),
    )
    yield (
        "timm resnet18 features",
        timm.create_model("resnet18", features_only=True),
        torch.randn(6, 3, 32, 32),
    )


def tensors(out):
    """Every tensor of a nested output, in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    return [t for item in out for t in tensors(item)]


def loss_of(out):
    return sum(t.float().pow(2).mean() for t in tensors(out))


def reference_step(model, x, n_slots, strategy):
    """One step of what DataParallel computes, on one device: per-slot copies, summed gradients.

    Buffers: under "broadcast" slot 0's replica shares the original's buffers, as in torch, so its
    running statistics survive; "rewire" is PR #20910's C++ fix, which left every buffer deep-copied
    (pytorch/pytorch#21144), so none survive (docs/library.md)."""
    pieces = x.chunk(n_slots)
    copies = [copy.deepcopy(model) for _ in pieces]
    outs = [c(p) for c, p in zip(copies, pieces)]
    out = [torch.cat(ts) for ts in zip(*(tensors(o) for o in outs))]
    loss_of(out).backward()
    for name, p in model.named_parameters():
        grads = [dict(c.named_parameters())[name].grad for c in copies]
        grads = [g for g in grads if g is not None]
        p.grad = sum(grads) if grads else None
    if strategy == "broadcast":
        for b, b0 in zip(model.buffers(), copies[0].buffers()):
            b.copy_(b0)
    return out


def compare(name, make_model, x, n_slots, strategy, steps):
    torch.manual_seed(0)
    ref = make_model
    twin = copy.deepcopy(ref)
    dp = DataParallel(twin, ["cpu"] * n_slots, strategy=strategy)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt_dp = torch.optim.SGD(twin.parameters(), lr=0.05)
    worst = 0.0
    for _ in range(steps):
        opt_ref.zero_grad()
        opt_dp.zero_grad()
        want = reference_step(ref, x, n_slots, strategy)
        got = tensors(dp(x))
        loss_of(got).backward()
        pairs = list(zip(got, want))
        pairs += [(q.grad, p.grad) for p, q in zip(ref.parameters(), twin.parameters()) if p.grad is not None]
        opt_ref.step()
        opt_dp.step()
        pairs += list(zip(twin.parameters(), ref.parameters())) + list(zip(twin.buffers(), ref.buffers()))
        for g, w in pairs:
            if g is None:
                return f"a gradient is None under DataParallel: {name}"
            worst = max(
                worst, (g.double() - w.double()).abs().max().item() / (w.double().abs().max().item() + 1e-6)
            )
    return worst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    failed = 0
    for name, model, x in models():
        model.train()
        for n_slots in (2, 3):
            for strategy in ("broadcast", "rewire"):
                worst = compare(name, copy.deepcopy(model), x, n_slots, strategy, args.steps)
                ok = isinstance(worst, float) and worst < 1e-4
                failed += not ok
                shown = f"largest relative difference {worst:.1e}" if isinstance(worst, float) else worst
                print(f"{'ok  ' if ok else 'FAIL'} {name:<32} {n_slots} slots {strategy:<9} {shown}")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
