"""GPU check for a machine with CUDA: a real round trip of GPU training state, and cross-device restores.

    python benchmarks/gpu_check.py [--params 20000000]

1. A model, its Adam optimizer and scheduler live on cuda:0, with gradients and CUDA random states; a
   snapshot is taken through the engine and restored into a fresh namespace: same device, same values,
   the optimizer still drives the model, and training continues bit-for-bit like an untouched copy.
2. The same snapshot restored with cuda:0 mapped to CPU, and in a child process that sees no GPU
   (CUDA_VISIBLE_DEVICES=""): tensors come back on CPU with the "restored to CPU" warning, same values.
3. With two GPUs or more: cuda:0 restored onto cuda:1.
4. Staging bandwidth: the engine's device-to-host staging of --staging-mb of CUDA tensors (what a kernel
   using CUDA pauses for at each background snapshot: capture_namespace, which copies every tensor to
   host memory) as a ratio to the plain reference, `tensor.to('cpu', non_blocking=True)` into pinned
   memory with one synchronize at the end; also a pageable `.to('cpu')` loop, and the way back
   (a restore onto the GPU) against pinned host-to-device copies.

Prints one line per check and a table; `--json` also prints the figures as one JSON object. Exits 1 if a
check fails. On a host without CUDA it says "no CUDA device" and exits 0: there is nothing to check there
(the CPU side is covered by tests/engine/test_torch_state.py). Runs in 1-3 minutes on one GPU.

    python benchmarks/gpu_check.py --json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, set before CUDA starts

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, sys, torch
from spotwarp_jupyter.engine import Settings, SnapshotEngine
engine = SnapshotEngine(Settings.resolve(project="gpu-check", storage=sys.argv[1], env={}))
ns = {}
_m, result = engine.restore_kernel("latest", ns)
params = list(ns["model"].parameters())
print(json.dumps({
    "cuda_available": torch.cuda.is_available(),
    "devices": sorted({str(p.device) for p in params}),
    "warnings": result.warnings,
    "checksum": float(sum(p.detach().double().sum() for p in params)),
    "linked": ns["opt"].param_groups[0]["params"][0] is params[0],
}))
"""


def _build(torch, params: int, device: str):
    width = max(8, int((params / 3) ** 0.5))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                torch.nn.GELU(), torch.nn.Linear(width, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x = torch.randn(64, width, device=device)
    y = torch.randn(64, 1, device=device)
    return model, opt, sched, x, y


def _steps(torch, model, opt, sched, x, y, n: int) -> list[float]:
    out = []
    for _ in range(n):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(torch.nn.functional.dropout(model(x), 0.1), y)
        loss.backward()
        opt.step()
        sched.step()
        out.append(loss.item())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=20_000_000, help="model size in parameters")
    parser.add_argument("--staging-mb", type=int, default=2048, help="MB of CUDA tensors for the staging figures")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each staging figure (median)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        return _no_cuda("torch is not installed", args.json)
    if not torch.cuda.is_available():
        return _no_cuda(f"torch {torch.__version__}, CUDA build {torch.version.cuda}", args.json)

    from spotwarp_jupyter.engine import Settings, SnapshotEngine
    from spotwarp_jupyter.training import capture_rng, restore_rng

    torch.use_deterministic_algorithms(True)
    failures: list[str] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""))
        if not ok:
            failures.append(name)

    print(f"gpu_check: {torch.cuda.device_count()} CUDA device(s): "
          + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
    store = tempfile.mkdtemp(prefix="spotwarp-gpu-check-")
    engine = SnapshotEngine(Settings.resolve(project="gpu-check", storage=store, env={}))

    model, opt, sched, x, y = _build(torch, args.params, "cuda:0")
    _steps(torch, model, opt, sched, x, y, 3)
    model(x).sum().backward()  # gradients being accumulated are part of the state
    twin = copy.deepcopy((model, opt, sched))
    torch.cuda.manual_seed_all(5)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    torch.cuda.synchronize()
    started = time.perf_counter()
    manifest = engine.snapshot_kernel({"model": model, "opt": opt, "sched": sched, "x": x, "y": y},
                                      extras={"rng": capture_rng()})
    snapshot_s = time.perf_counter() - started
    expected_draw = torch.rand(4, device="cuda:0").tolist()

    # 1. same device
    torch.cuda.manual_seed_all(99)
    ns: dict = {}
    started = time.perf_counter()
    _m, result = engine.restore_kernel("latest", ns)
    torch.cuda.synchronize()
    restore_s = time.perf_counter() - started
    params = list(ns["model"].parameters())
    check("parameters restored on cuda:0", all(p.device == torch.device("cuda:0") for p in params))
    check("optimizer state restored on cuda:0", all(t.device.type == "cuda" for s in ns["opt"].state.values()
                                                    for t in s.values() if torch.is_tensor(t) and t.dim()))
    check("values identical", all(torch.equal(a, b) for a, b in zip(params, model.parameters())))
    check("gradients kept", all(b.grad is not None and torch.equal(a.grad, b.grad) for a, b in zip(params, model.parameters())))
    check("optimizer drives the restored model", ns["opt"].param_groups[0]["params"][0] is params[0])
    check("no device warning", not any("restored to CPU" in w for w in result.warnings), "; ".join(result.warnings))
    restore_rng(result.extras["rng"])
    check("CUDA random state restored", torch.rand(4, device="cuda:0").tolist() == expected_draw)
    for module in (ns["model"], twin[0]):
        for p in module.parameters():
            p.grad = None
    torch.manual_seed(1)
    torch.cuda.manual_seed_all(1)
    continued = _steps(torch, ns["model"], ns["opt"], ns["sched"], ns["x"], ns["y"], 3)
    torch.manual_seed(1)
    torch.cuda.manual_seed_all(1)
    reference = _steps(torch, *twin, x, y, 3)
    check("training continues bit-for-bit on the GPU", continued == reference, f"{continued} vs {reference}")

    # 2. cross-device: mapped to CPU here, and in a process that sees no GPU
    ns = {}
    _m, result = engine.restore_kernel("latest", ns, device_map={"cuda:0": "cpu"})
    cpu_params = list(ns["model"].parameters())
    check("device_map cuda:0 -> cpu", all(p.device.type == "cpu" for p in cpu_params))
    check("values identical on CPU", all(torch.equal(a, b.cpu()) for a, b in zip(cpu_params, model.parameters())))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    child = subprocess.run([sys.executable, "-c", CHILD, store], capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if child.returncode != 0:
        check("restore on a host without GPU", False, child.stderr.strip().splitlines()[-1] if child.stderr else "")
    else:
        report = json.loads(child.stdout.strip().splitlines()[-1])
        expected_sum = float(sum(p.detach().double().sum() for p in model.parameters()))
        check("restore on a host without GPU goes to CPU", report["devices"] == ["cpu"] and not report["cuda_available"],
              str(report["devices"]))
        check("... with the restored-to-CPU warning",
              any("cuda:0 were restored to CPU" in w for w in report["warnings"]), "; ".join(report["warnings"]))
        check("... same values, optimizer linked", report["checksum"] == expected_sum and report["linked"])

    # 3. another GPU
    if torch.cuda.device_count() > 1:
        ns = {}
        engine.restore_kernel("latest", ns, device_map={"cuda:0": "cuda:1"})
        check("device_map cuda:0 -> cuda:1", all(p.device == torch.device("cuda:1") for p in ns["model"].parameters()))
    else:
        print("skip  device_map cuda:0 -> cuda:1 (one GPU)")

    size = manifest.size
    print()
    print(f"{'state':>12} {'snapshot':>10} {'restore':>10}   (model {nbytes / 1e6:.0f} MB on GPU, snapshot {size / 1e6:.0f} MB)")
    print(f"{'GPU->store':>12} {snapshot_s:>9.2f}s {restore_s:>9.2f}s")
    del ns, cpu_params, params, model, opt, sched, twin
    torch.cuda.empty_cache()
    staging = staging_figures(torch, args.staging_mb << 20, args.reps)
    print_staging(staging)
    print(f"\ngpu_check: {'all checks passed' if not failures else 'FAILED: ' + ', '.join(failures)}")
    if args.json:
        print(json.dumps({"cuda": True, "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                          "torch": torch.__version__, "checks_failed": failures, "snapshot_s": snapshot_s,
                          "restore_s": restore_s, "model_bytes": nbytes, "staging": staging}, indent=2))
    return 1 if failures else 0


def _no_cuda(why: str, as_json: bool) -> int:
    print(f"gpu_check: no CUDA device ({why}); nothing to check on this host")
    if as_json:
        print(json.dumps({"cuda": False, "reason": why}))
    return 0


def _median_time(torch, fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def staging_figures(torch, nbytes: int, reps: int) -> dict:
    """Device-to-host staging (the engine's, and plain copies) and host-to-device restore, in GB/s and as ratios."""
    from spotwarp_jupyter.engine.variables.capture import capture_namespace
    from spotwarp_jupyter.engine.variables.load import _allocate

    per = 64 << 20  # tensors of 64 MiB, as a model's layers and optimizer states come
    tensors = [torch.rand(per // 4, device="cuda:0") for _ in range(max(1, nbytes // per))]
    total = sum(t.numel() * t.element_size() for t in tensors)
    pinned = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

    def pinned_copy() -> None:
        for src, dst in zip(tensors, pinned):
            dst.copy_(src, non_blocking=True)

    def to_cpu_nonblocking() -> None:
        [t.to("cpu", non_blocking=True) for t in tensors]

    def pageable() -> None:
        [t.to("cpu") for t in tensors]

    ns = {f"t{i}": t for i, t in enumerate(tensors)}

    def engine_staging() -> None:
        capture_namespace(ns)  # serializes every group: each CUDA tensor is staged to host memory

    host = [torch.frombuffer(memoryview(_allocate(per)), dtype=torch.float32) for _ in tensors]

    def pinned_upload() -> None:
        for src, dst in zip(pinned, tensors):
            dst.copy_(src, non_blocking=True)

    def restore_upload() -> None:  # what a restore does: a tensor rebuilt over freshly read host memory, then .to(device)
        [h.to("cuda:0") for h in host]

    seconds = {name: _median_time(torch, fn, reps) for name, fn in (
        ("pinned_d2h", pinned_copy), ("to_cpu_non_blocking", to_cpu_nonblocking), ("pageable_d2h", pageable),
        ("engine_staging", engine_staging), ("pinned_h2d", pinned_upload), ("restore_h2d", restore_upload))}
    gbps = {name: total / s / 1e9 for name, s in seconds.items()}
    return {"bytes": total, "seconds": seconds, "gb_per_s": gbps,
            "engine_staging_vs_pinned": gbps["engine_staging"] / gbps["pinned_d2h"],
            "pageable_vs_pinned": gbps["pageable_d2h"] / gbps["pinned_d2h"],
            "to_cpu_non_blocking_vs_pinned": gbps["to_cpu_non_blocking"] / gbps["pinned_d2h"],
            "restore_h2d_vs_pinned": gbps["restore_h2d"] / gbps["pinned_h2d"]}


def print_staging(f: dict) -> None:
    g, s = f["gb_per_s"], f["seconds"]
    print(f"\nstaging {f['bytes'] / 1e9:.2f} GB of CUDA tensors (median of runs)")
    rows = [
        ("D2H reference: copy_ into pinned, non_blocking", "pinned_d2h", "1.00x"),
        ("D2H tensor.to('cpu', non_blocking=True)", "to_cpu_non_blocking", f"{f['to_cpu_non_blocking_vs_pinned']:.2f}x"),
        ("D2H tensor.to('cpu'), pageable", "pageable_d2h", f"{f['pageable_vs_pinned']:.2f}x"),
        ("D2H SpotWarp staging (capture_namespace)", "engine_staging", f"{f['engine_staging_vs_pinned']:.2f}x"),
        ("H2D reference: copy_ from pinned, non_blocking", "pinned_h2d", "1.00x"),
        ("H2D SpotWarp restore (.to(device) from read memory)", "restore_h2d", f"{f['restore_h2d_vs_pinned']:.2f}x"),
    ]
    for label, key, ratio in rows:
        print(f"  {label:<52} {g[key]:>7.1f} GB/s {s[key]:>7.3f} s  {ratio:>6} of the reference")


if __name__ == "__main__":
    sys.exit(main())
