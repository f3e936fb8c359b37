"""Ray Train on "tpu": TorchTrainer with 2 workers runs a DDP training loop written as for "cuda"
(the model and batches moved to "tpu", the process group from TorchConfig(backend="tccl")), and
the trained weights equal one process training on the full batch. scripts/setup.sh installs Ray."""
import torch


def train_loop(config):
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ray.train

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = torch.device("tpu")  # where a cuda script would say ray.train.torch.get_device()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = config["x"], config["y"]
    per = x.shape[0] // world
    for _ in range(config["steps"]):
        opt.zero_grad()
        out = model(x[rank * per:(rank + 1) * per].to(device))
        loss = nn.functional.mse_loss(out, y[rank * per:(rank + 1) * per].to(device))
        loss.backward()
        opt.step()
    if rank == 0:
        import json

        weights = [p.detach().cpu().tolist() for p in model.module.parameters()]
        with open(config["out"], "w") as f:
            json.dump({"weights": weights, "device": str(next(model.parameters()).device),
                       "backend": torch.distributed.get_backend()}, f)


def reference(x, y, steps):
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_torch_trainer_ddp_on_tpu(tmp_path):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=g), torch.randn(16, 2, generator=g)
    import sys

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"x": x, "y": y, "steps": 5, "out": str(tmp_path / "rank0.json")},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            torch_config=TorchConfig(backend="tccl"),
            run_config=RunConfig(storage_path=str(tmp_path)),
        )
        trainer.fit()
    finally:
        ray.shutdown()
    import json

    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["device"] == "tpu:0" and result["backend"] == "tccl"
    for got, want in zip(result["weights"], reference(x, y, 5)):
        torch.testing.assert_close(torch.tensor(got), want, atol=1e-5, rtol=1e-5)
