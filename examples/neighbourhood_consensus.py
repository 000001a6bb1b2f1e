"""Neighbourhood consensus on 4-D correlation volumes, trained with convgen.torch's Conv4d.

Matching two images scores every pair of cells: a 4-D correlation volume corr[i, j, k, l] between cell
(i, j) of image A and cell (k, l) of image B. With weak features most best scores are wrong matches. The
true matches of a rigid motion, however, line up: they form a plane through the volume, while the wrong
ones are scattered. A stack of Conv4d layers run on the volume (and, for symmetry, on the volume with A and
B swapped) learns to reward matches whose neighbours agree: the neighbourhood consensus of NCNet (Rocco
et al., 2018), which needs the 4-D convolution torch does not have.

Data are synthetic with a known answer: B's features are A's, shifted circularly by a random offset, plus
noise; so cell (i, j) of A matches ((i + dy) mod H, (j + dx) mod W) of B, and the volume is periodic, which
circular padding respects. The loss is the cross-entropy of each A cell's scores over the B cells against its
true match; the script prints it, the match accuracy (and that of the raw correlation) per logging step, the
mean time per step, and exits 1 if the loss did not go down.

    python examples/neighbourhood_consensus.py --device cuda        # one GPU: the default sizes
    python examples/neighbourhood_consensus.py --quick              # CPU: tiny sizes, seconds
    torchrun --standalone --nproc_per_node=2 examples/neighbourhood_consensus.py --device cuda  # DDP, NCCL

Under torchrun each process trains on its own synthetic batches (seeded by its rank) and DDP averages the
gradients; on the CPU the processes talk over gloo.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from convgen.torch.nn import Conv4d


@dataclass(frozen=True)
class Process:
    """Where this process runs and which share of a distributed run it is."""

    device: torch.device
    rank: int
    world_size: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def say(self, text: str) -> None:
        """Prints from the first process only: the others compute the same averaged figures."""
        if self.rank == 0:
            print(text, flush=True)


def start_process(device_kind: str) -> Process:
    """One process, or one of torchrun's (it sets WORLD_SIZE, RANK and LOCAL_RANK): NCCL on GPUs, gloo on CPUs."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Process(torch.device(device_kind), rank=0, world_size=1)
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_kind == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # before NCCL starts, so each process owns its GPU
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return Process(device, rank=dist.get_rank(), world_size=world_size)


class NeighbourhoodConsensus(torch.nn.Module):
    """Conv4d layers with periodic padding, applied to the volume and to its A/B-swapped transpose."""

    def __init__(self, channels: int, layers: int) -> None:
        super().__init__()
        widths = [1] + [channels] * (layers - 1) + [1]
        stack: list[torch.nn.Module] = []
        for index, (width_in, width_out) in enumerate(zip(widths, widths[1:])):
            stack.append(Conv4d(width_in, width_out, 3, padding=1, padding_mode="circular"))
            if index < layers - 1:
                stack.append(torch.nn.ReLU())
        self.filter = torch.nn.Sequential(*stack)

    def forward(self, volume: torch.Tensor) -> torch.Tensor:
        swapped = volume.permute(0, 1, 4, 5, 2, 3)  # B's cells first: matching B to A
        return self.filter(volume) + self.filter(swapped).permute(0, 1, 4, 5, 2, 3)


@dataclass(frozen=True)
class Batch:
    volume: torch.Tensor  # [N, 1, H, W, H, W] correlation of A's cells with B's
    target: torch.Tensor  # [N, H, W]: flat index k * W + l of the B cell that A's cell (i, j) matches


def synthetic_batch(args: argparse.Namespace, generator: torch.Generator, device: torch.device) -> Batch:
    """A's features, B = A shifted by a random offset per pair plus noise, and the true matches."""
    size = args.size
    features_a = torch.randn(args.batch, args.features, size, size, generator=generator)
    shifts = torch.randint(0, size, (args.batch, 2), generator=generator).tolist()
    features_b = torch.stack([torch.roll(a, shifts=tuple(shift), dims=(1, 2)) for a, shift in zip(features_a, shifts)])
    features_b += args.noise * torch.randn(features_b.shape, generator=generator)
    cells = torch.arange(size)
    targets = [((cells[:, None] + dy) % size) * size + (cells[None, :] + dx) % size for dy, dx in shifts]
    features_a, features_b = features_a.to(device), features_b.to(device)
    volume = torch.einsum("ncij,nckl->nijkl", features_a, features_b) / args.features**0.5
    return Batch(volume.unsqueeze(1), torch.stack(targets).to(device))


def match_loss(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each A cell's scores over all B cells against its true match."""
    cells = target.shape[1] * target.shape[2]
    return torch.nn.functional.cross_entropy(scores.reshape(-1, cells), target.reshape(-1))


def match_accuracy(scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    cells = target.shape[1] * target.shape[2]
    return (scores.reshape(-1, cells).argmax(dim=1) == target.reshape(-1)).float().mean()


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", type=int, default=16, help="cells per image axis: the volume is size^4")
    parser.add_argument("--batch", type=int, default=16, help="image pairs per step and process")
    parser.add_argument("--features", type=int, default=2, help="feature channels per cell (few: weak matches)")
    parser.add_argument("--noise", type=float, default=1.5, help="noise added to B's features")
    parser.add_argument("--channels", type=int, default=16, help="channels of the hidden Conv4d layers")
    parser.add_argument("--layers", type=int, default=3, help="Conv4d layers")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--quick", action="store_true", help="tiny defaults, for a smoke test on a CPU")
    if parser.parse_known_args(argv)[0].quick:  # new defaults; options given with --quick still win
        parser.set_defaults(size=6, batch=4, channels=4, layers=2, steps=30, log_every=5)
    args = parser.parse_args(argv)
    if not 0 < args.log_every < args.steps:
        parser.error(f"--log-every must be positive and below --steps (the first and last logging windows are "
                     f"compared), got --log-every {args.log_every} --steps {args.steps}")
    return args


def average_over_processes(value: torch.Tensor, process: Process) -> float:
    if process.distributed:
        value = value.clone()
        dist.all_reduce(value)
        value /= process.world_size
    return value.item()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args: argparse.Namespace, process: Process) -> bool:
    """Trains and logs; True if the last logging window's mean loss is below the first's."""
    torch.manual_seed(args.seed)  # the same initial weights in every process (DDP also broadcasts rank 0's)
    model = NeighbourhoodConsensus(args.channels, args.layers).to(process.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    if process.distributed:
        device_ids = [process.device.index] if process.device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    if args.compile:
        model = torch.compile(model)
    generator = torch.Generator().manual_seed(args.seed + 1 + process.rank)  # each process its own data
    process.say(f"{process.world_size} process(es) on {process.device.type}; volume {args.size}^4, "
                f"batch {args.batch} per process, Conv4d x{args.layers} ({args.channels} channels)")
    window_losses = []
    window_loss = torch.zeros((), device=process.device)
    timed_steps, timed_seconds = 0, 0.0
    synchronize(process.device)
    window_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        batch = synthetic_batch(args, generator, process.device)
        scores = model(batch.volume)
        loss = match_loss(scores, batch.target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        window_loss += loss.detach()
        if step % args.log_every and step != args.steps:
            continue
        synchronize(process.device)
        window_steps = (step - 1) % args.log_every + 1
        if window_losses:  # the first window holds the warm-up (kernel compilation, allocator growth)
            timed_steps += window_steps
            timed_seconds += time.perf_counter() - window_start
        window_losses.append(average_over_processes(window_loss / window_steps, process))
        with torch.no_grad():
            accuracy = average_over_processes(match_accuracy(scores, batch.target), process)
            raw_accuracy = average_over_processes(match_accuracy(batch.volume, batch.target), process)
        process.say(f"step {step:5d}  loss {window_losses[-1]:.4f}  match accuracy {accuracy:.3f} "
            f"(raw correlation {raw_accuracy:.3f})")
        window_loss.zero_()
        synchronize(process.device)
        window_start = time.perf_counter()
    if timed_steps:
        milliseconds = 1e3 * timed_seconds / timed_steps
        process.say(f"mean time per step: {milliseconds:.2f} ms over {timed_steps} steps after warm-up")
    went_down = window_losses[-1] < window_losses[0]
    verdict = "went down" if went_down else "DID NOT go down"
    process.say(f"loss {window_losses[0]:.4f} -> {window_losses[-1]:.4f}: {verdict}")
    return went_down


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("neighbourhood_consensus: --device cuda needs a GPU, and torch sees none", file=sys.stderr)
        return 2
    process = start_process(args.device)
    try:
        return 0 if train(args, process) else 1
    finally:
        if process.distributed:
            dist.barrier()  # no process leaves while a peer is still in a collective
            dist.destroy_process_group()


def leave(status: int) -> None:
    """Exit with `status`. A process of a distributed run leaves without shutting the interpreter down:
    with torch 2.13 the group outlives destroy_process_group once DDP has used it, and a gloo thread that
    releases its last finished collective while the interpreter shuts down aborts the process
    ("terminate called without an active exception", after the run itself succeeded)."""
    if dist.is_available() and dist.is_torchelastic_launched():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    leave(main())
