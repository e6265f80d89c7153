import os
import secrets
import tempfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Gateways started by tests write their local admin credential here, never into the user's own state folder.
os.environ.setdefault("ARGOSY_ADMIN_FILE", os.path.join(tempfile.mkdtemp(prefix="argosy-test-admin-"), "admin.json"))
# Key hashes are keyed with this pepper here and in every gateway the tests start (they inherit it), so no
# test writes ~/.config/argosy/key-pepper.
os.environ.setdefault("ARGOSY_KEY_PEPPER", "argosy-test-pepper-" + secrets.token_hex(8))
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random-weight Llama checkpoint with a trained BPE tokenizer and a chat template."""
    from argosy.engine.random_model import make_random_model

    return str(make_random_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", init_std=0.2))


@pytest.fixture(scope="session")
def tool_model_server(tmp_path_factory):
    """One engine server for the structured-output and tool-calling tests: a tiny random-weight Qwen2 whose
    chat template writes tools (tests/structured_fixtures.py)."""
    from tests.server_fixtures import ServerProcess
    from tests.structured_fixtures import make_tool_model

    model = make_tool_model(tmp_path_factory.mktemp("tool-model"))
    with ServerProcess(model, "--max-model-len", "1024", "--revision", "r7") as server:
        yield server


# Triton's interpreter is chosen for the whole process when triton is imported: the tests that need it run
# in a process of their own (tests/test_triton.py), never in this session.
collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["triton_interp"]
