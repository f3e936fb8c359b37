import gc
import os
import sys

# Lowerings that read an argument name none of their ops' overloads has raise (a misspelled
# optional argument would otherwise read as "not given"); set before torch autoloads torchtpu.
os.environ.setdefault("TORCHTPU_CHECK_ARGS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

import torchtpu  # noqa: E402,F401  (also autoloaded by `import torch`)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _eager_mode():
    # A test that switches fused eager mode on or off leaves the next ones in the default (or
    # TORCHTPU_FUSED_EAGER's) mode.
    was = torch.tpu.is_fused_eager()
    yield
    if torch.tpu.is_fused_eager() != was:
        torch.tpu.set_fused_eager(was)


# Files of long end-to-end runs (several processes, whole training or serving loops): run first,
# so that the parallel workers do not end with one of them running alone.
LONG_FIRST = ("test_torchtitan.py", "test_probe.py", "test_conformance.py", "test_ray_train.py",
              "test_distributed.py", "test_compile_random.py", "test_examples.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)


def pytest_collection_finish(session):
    # The imports (torch, transformers, ...) and the collected tests are objects that live to
    # the end: without this, every full collection of the cyclic GC walks them again (about 7%
    # of an op test's time).
    gc.collect()
    gc.freeze()
