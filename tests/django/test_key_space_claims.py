"""The key space's claim on its less walked paths: what a refusal tells the other
project's operator, a stored value that is not a claim, a forced claim over this
project's own former identity, and a release followed by the next accept
(docs/howto/valkey.md#one-project-per-key-space)."""

from __future__ import annotations

import json

import pytest

from django_outbox.core.owner import Claim, ClaimResult, KeySpaceOwner
from django_outbox.errors import KeySpaceClaimed
from tests.support.helpers import accept


def test_a_refusal_names_the_holder_its_host_and_when_it_claimed(make_outbox, r):
    held = Claim("production", "production.settings", "prod-1", "2026-01-01T12:00:00.000000Z")
    r.set("outboxowner", held.to_json())
    with pytest.raises(KeySpaceClaimed) as refused:
        accept(make_outbox(key_space_owner=KeySpaceOwner("staging")), "k1")
    assert "'production.settings' on host prod-1, claimed 2026-01-01T12:00:00.000000Z" in str(
        refused.value
    )
    # a claim with no label, host or time still says who: nobody named
    r.set("outboxowner", Claim("production").to_json())
    with pytest.raises(KeySpaceClaimed, match="unnamed"):
        accept(make_outbox(key_space_owner=KeySpaceOwner("staging")), "k1")


@pytest.mark.parametrize(
    "stored",
    [json.dumps({"label": "no id here"}), json.dumps({"id": 7}), "[1, 2]", "not json"],
)
def test_a_stored_value_that_is_no_claim_is_somebody_elses(make_outbox, r, stored):
    r.set("outboxowner", stored)
    outbox = make_outbox(key_space_owner=KeySpaceOwner("mine"))
    with pytest.raises(KeySpaceClaimed, match="a value django-outbox did not write"):
        accept(outbox, "k1")
    assert r.get("outboxowner") == stored  # nothing overwritten
    assert outbox.claim_key_space(force=True) is ClaimResult.TAKEN_OVER


def test_a_forced_claim_over_a_former_identity_is_a_renewal(make_outbox, r):
    make_outbox(key_space_owner=KeySpaceOwner("old-key")).claim_key_space()
    rotated = make_outbox(key_space_owner=KeySpaceOwner("new-key", former=("old-key",)))
    assert rotated.claim_key_space(force=True) is ClaimResult.RENEWED
    assert Claim.parse(r.get("outboxowner")).id == "new-key"
    assert rotated.claim_key_space(force=True) is ClaimResult.OWNED


def test_after_a_release_the_next_accept_claims_the_space_again(make_outbox, r):
    mine = make_outbox(key_space_owner=KeySpaceOwner("mine", label="mine.settings"))
    accept(mine, "k1")
    assert Claim.parse(r.get("outboxowner")).id == "mine"
    assert mine.release_key_space() is True
    assert r.get("outboxowner") is None
    accept(mine, "k2")
    assert Claim.parse(r.get("outboxowner")).id == "mine"
    # ...so another project pointed here is refused again, not let in by the gap
    with pytest.raises(KeySpaceClaimed, match=r"'mine\.settings'"):
        accept(make_outbox(key_space_owner=KeySpaceOwner("other")), "k3", ses="s2")
