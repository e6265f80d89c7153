import os
import tempfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Gateways started by tests write their local admin credential here, never into the user's own state folder.
os.environ.setdefault("ARGOSY_ADMIN_FILE", os.path.join(tempfile.mkdtemp(prefix="argosy-test-admin-"), "admin.json"))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random-weight Llama checkpoint with a trained BPE tokenizer and a chat template."""
    from argosy.engine.random_model import make_random_model

    return str(make_random_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", init_std=0.2))
