"""Tenant salts on the router side: the block hashes a router looks up
differ between tenants for the same prompt and agree for one tenant; the predicted-cached
header is off by default when several keyed tenants share one cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_service.hashing import block_hashes, model_salt, tenant_salt
from deploy.config import IndexConfig, KvrouteConfig
from router.auth.keys import ApiKeyConfig, AuthConfig, hash_key
from router.core import RouterCore
from tests.stacks import sim_model

MODEL = "sim-salt"
PROMPT = list(range(5, 5 + 200))
KEYS = AuthConfig(api_keys=[ApiKeyConfig(name="alice", key_sha256=hash_key("a" * 40))])


def test_tenant_salt_separates_tenants_and_keeps_one_tenant_stable() -> None:
    salt = model_salt(MODEL)
    alice = block_hashes(PROMPT, 64, tenant_salt(salt, "alice"))
    assert alice == block_hashes(PROMPT, 64, tenant_salt(salt, "alice"))
    bob = block_hashes(PROMPT, 64, tenant_salt(salt, "bob"))
    assert len(alice) == 3 and not set(alice) & set(bob)
    assert tenant_salt(salt, None) == salt  # isolation off: the old hashes
    assert not set(alice) & set(block_hashes(PROMPT, 64, salt))
    assert tenant_salt(model_salt("other"), "alice") != tenant_salt(salt, "alice")


def test_router_hashes_carry_the_tenant(tiny_model_dir: Path) -> None:
    cfg = KvrouteConfig(models=[sim_model(MODEL, tiny_model_dir)],
                        index=IndexConfig(tenant_isolation=True))
    core = RouterCore(cfg, {})
    w = {MODEL: 1.0}
    alice, bob = core._hashes(PROMPT, w, "alice"), core._hashes(PROMPT, w, "bob")
    assert alice == core._hashes(PROMPT, w, "alice")
    assert not set(alice[MODEL]) & set(bob[MODEL])
    assert core._hashes(PROMPT, w) == {MODEL: block_hashes(PROMPT, 64, model_salt(MODEL))}


@pytest.mark.parametrize(("isolation", "keys", "flag", "sent"), [
    (False, False, None, True),  # one tenant: nothing to leak
    (False, True, None, False),  # keyed tenants share the cache: opt-in only
    (True, True, None, True),  # each tenant sees only its own cache
    (False, True, True, True),
    (True, True, False, False),
])
def test_predicted_header_default(tiny_model_dir: Path, isolation: bool, keys: bool,
                                  flag: bool | None, sent: bool) -> None:
    cfg = KvrouteConfig(models=[sim_model(MODEL, tiny_model_dir)],
                        index=IndexConfig(tenant_isolation=isolation,
                                          predicted_cached_header=flag),
                        auth=KEYS if keys else AuthConfig())
    assert RouterCore(cfg, {}).predicted_header is sent
