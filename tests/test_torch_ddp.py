"""DistributedDataParallel over two CPU processes (gloo) on a small Conv4d network: after one step each
process holds the gradients that one process computes on the whole batch."""

import os

import pytest

torch = pytest.importorskip("torch")
distributed = pytest.importorskip("torch.distributed")
if not distributed.is_available() or not distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from convgen.torch import nn as cnn  # noqa: E402

WORLD_SIZE = 2
BATCH = 4  # split evenly: each process takes BATCH // WORLD_SIZE images


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        cnn.Conv4d(2, 3, 3, padding=1, padding_mode="circular", dtype=torch.float64),
        torch.nn.Tanh(),
        cnn.MaxPool4d(2),
        cnn.Conv4d(3, 2, 2, dtype=torch.float64),
    )


def make_batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn((BATCH, 2, 4, 4, 4, 4), dtype=torch.float64, generator=generator)


def loss_of(model, images):
    # A mean over the images: DDP averages the processes' gradients, so equal shares give the whole batch's mean.
    return model(images).square().mean()


def gradients(model):
    return {name: parameter.grad.detach().clone() for name, parameter in model.named_parameters()}


def train_one_step(rank, out_dir):
    # A file store in the test's own directory: no port to find free, none to lose to another process.
    distributed.init_process_group("gloo", init_method=f"file://{out_dir}/store", rank=rank, world_size=WORLD_SIZE)
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    share = BATCH // WORLD_SIZE
    loss_of(model, make_batch()[rank * share:(rank + 1) * share]).backward()
    torch.save(gradients(model.module), f"{out_dir}/rank{rank}.pt")
    distributed.barrier()  # no process leaves while its peer is still in a collective
    distributed.destroy_process_group()
    # Leave without shutting the interpreter down: with torch 2.13 the group outlives destroy_process_group
    # once DDP has used it, and a gloo thread releasing its last finished collective during the shutdown
    # aborts the process after the gradients are saved (seen in CI; the example's `leave` says more).
    os._exit(0)


def test_ddp_gradients_equal_one_process_on_the_whole_batch(tmp_path):
    torch.multiprocessing.spawn(train_one_step, args=(str(tmp_path),), nprocs=WORLD_SIZE, join=True)
    model = make_model()
    loss_of(model, make_batch()).backward()
    expected = gradients(model)
    assert list(expected) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    for rank in range(WORLD_SIZE):
        actual = torch.load(tmp_path / f"rank{rank}.pt")
        assert list(actual) == list(expected)
        for name, gradient in expected.items():
            assert gradient.abs().max() > 0, name
            torch.testing.assert_close(actual[name], gradient, rtol=1e-12, atol=1e-14, msg=name)
