"""Named agents and the router (docs/howto/agents.md): a worker delivers each session to the
agent the router names, verifies with that agent's verifier, tells listeners which agent
served a step, and shows a router's mistake on the entry without stopping."""

import pytest

from django_outbox import Status, Verdict
from django_outbox.core.agents import DEFAULT_AGENT, Agent, UnknownAgent, current_agent
from django_outbox.errors import AmbiguousError

WS = "w1"


class Recorder:
    """An agent that records what it received, and which agent the step said it served."""

    def __init__(self, name):
        self.name = name
        self.delivered = []
        self.verified = []
        self.served_as = []
        self.ambiguous_once = set()

    async def deliver(self, entry, *, workspace_id, session_id, attempt):
        self.served_as.append(current_agent.get().name)
        if entry.text in self.ambiguous_once:
            self.ambiguous_once.discard(entry.text)
            self.delivered.append((session_id, entry.text))
            raise AmbiguousError("cut after sending")
        self.delivered.append((session_id, entry.text))

    def verify(self, entry, *, workspace_id, session_id):  # sync, run in a thread
        self.served_as.append(current_agent.get().name)
        self.verified.append(entry.text)
        sent = (session_id, entry.text) in self.delivered
        return Verdict.DELIVERED if sent else Verdict.ABSENT

    def agent(self):
        return Agent(self.name, self.deliver, self.verify, options={"who": self.name})


def by_prefix(workspace_id, session_id):
    return "alpha" if session_id.startswith("a") else "beta"


async def test_a_worker_delivers_each_session_to_the_agent_its_router_names(outbox_factory):
    alpha, beta = Recorder("alpha"), Recorder("beta")
    beta.ambiguous_once.add("b-1")  # verified by beta's verifier, not alpha's
    outbox = outbox_factory(agents={"alpha": alpha.agent(), "beta": beta.agent()}, router=by_prefix)
    steps = []
    outbox.agent_step_listeners.append(lambda *step: steps.append(step[:3]))
    for i in range(3):
        for ses in ("a1", "b1", "a2"):
            text = f"{ses[0]}-{i}"
            await outbox.aaccept(WS, ses, user_id="u", client_message_id=f"{ses}{i}", text=text)
    for _ in range(5):  # a run ends when nothing is due; the verification is due at once
        await outbox.arun(once=True, concurrency=4, heartbeat=False)
        if not any([await outbox.alist(WS, s) for s in ("a1", "b1", "a2")]):
            break

    assert sorted(alpha.delivered) == sorted(
        [(s, f"a-{i}") for s in ("a1", "a2") for i in range(3)]
    )
    assert beta.delivered == [("b1", "b-0"), ("b1", "b-1"), ("b1", "b-2")]
    assert beta.verified == ["b-1"] and alpha.verified == []
    assert set(alpha.served_as) == {"alpha"} and set(beta.served_as) == {"beta"}
    assert ("beta", "verify", "delivered") in steps
    assert ("alpha", "deliver", "delivered") in steps
    assert {agent for agent, _, _ in steps} == {"alpha", "beta"}


async def test_a_router_naming_no_agent_shows_on_the_entry_and_the_worker_goes_on(
    outbox_factory,
):
    good = Recorder("good")
    outbox = outbox_factory(
        agents={"good": good.agent()},
        router=lambda ws, ses: "good" if ses == "fine" else "nowhere",
    )
    await outbox.aaccept(WS, "lost", user_id="u", client_message_id="k1", text="t1")
    await outbox.aaccept(WS, "fine", user_id="u", client_message_id="k2", text="t2")
    stats = await outbox.arun(once=True, heartbeat=False)
    assert stats.errors == 0
    assert good.delivered == [("fine", "t2")]
    [entry] = await outbox.alist(WS, "lost")
    assert entry.status is Status.PENDING and entry.attempts == 0
    assert entry.transient_fails == 1
    assert "'nowhere'" in entry.last_error and "not configured" in entry.last_error


async def test_a_router_that_raises_is_a_transient_failure_never_a_send(outbox_factory):
    good = Recorder("good")

    def broken(ws, ses):
        raise KeyError(ses)

    outbox = outbox_factory(agents={"good": good.agent()}, router=broken)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k1", text="t1")
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert good.delivered == [] and entry.transient_fails == 1
    assert "ROUTER raised KeyError" in entry.last_error


async def test_a_verification_whose_agent_cannot_be_found_stays_inconclusive(outbox_factory):
    good = Recorder("good")
    good.ambiguous_once.add("t")
    route = {"name": "good"}
    outbox = outbox_factory(agents={"good": good.agent()}, router=lambda ws, ses: route["name"])
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    route["name"] = "gone"
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.VERIFYING and entry.verify_attempts == 1
    assert good.delivered == [("s", "t")]  # never sent again
    route["name"] = "good"
    assert await outbox.adeliver_once(WS, "s")
    assert await outbox.alist(WS, "s") == []


async def test_the_single_deliverer_is_the_default_agent(outbox_factory):
    seen = []

    async def deliver(entry, **kwargs):
        seen.append(current_agent.get().name)

    other = Recorder("other")
    outbox = outbox_factory(
        deliverer=deliver,
        agents={"other": other.agent()},
        router=lambda ws, ses: DEFAULT_AGENT if ses == "d" else "other",
    )
    assert outbox.agent_names() == ("default", "other")
    await outbox.aaccept(WS, "d", user_id="u", client_message_id="k1", text="t1")
    await outbox.aaccept(WS, "o", user_id="u", client_message_id="k2", text="t2")
    await outbox.arun(once=True, heartbeat=False)
    assert seen == ["default"] and other.delivered == [("o", "t2")]
    # Without a router every session is the default agent's, as before agents existed.
    plain = outbox_factory(deliverer=deliver)
    assert plain.agent_for(WS, "x").name == DEFAULT_AGENT
    assert plain.agent_for(WS, "x").deliverer is deliver


async def test_agent_for_and_aborter_for_resolve_in_one_place(outbox_factory):
    def abort(entry, **kwargs):
        pass

    alpha = Agent("alpha", lambda *a, **k: None, aborter=abort)
    beta = Agent("beta", lambda *a, **k: None)
    outbox = outbox_factory(agents={"alpha": alpha, "beta": beta}, router=by_prefix)
    assert outbox.agent_for(WS, "a1") is alpha and outbox.agent_for(WS, "b1") is beta
    assert outbox.aborter_for(WS, "a1") is abort and outbox.aborter_for(WS, "b1") is None
    assert outbox_factory(deliverer=print, aborter=abort).aborter_for(WS, "s") is abort
    lone = outbox_factory(agents={"beta": beta})
    assert lone.agent_for(WS, "any") is beta
    with pytest.raises(UnknownAgent) as raised:
        outbox_factory(agents={"alpha": alpha, "beta": beta}).agent_for(WS, "s")
    assert raised.value.known == ("alpha", "beta")
    with pytest.raises(UnknownAgent, match="returned a int"):
        outbox_factory(agents={"alpha": alpha}, router=lambda ws, ses: 3).agent_for(WS, "s")
    with pytest.raises(ValueError, match="must be an Agent named 'x'"):
        outbox_factory(agents={"x": alpha})


async def test_an_agent_without_a_verifier_ends_an_unknown_outcome_in_error(outbox_factory):
    async def cut(entry, **kwargs):
        raise AmbiguousError("cut")

    verified = Recorder("v")
    outbox = outbox_factory(
        agents={"blind": Agent("blind", cut), "seeing": Agent("seeing", cut, verified.verify)},
        router=lambda ws, ses: ses,
    )
    for ses in ("blind", "seeing"):
        await outbox.aaccept(WS, ses, user_id="u", client_message_id=ses, text="t")
        assert await outbox.adeliver_once(WS, ses)
    [blind] = await outbox.alist(WS, "blind")
    [seeing] = await outbox.alist(WS, "seeing")
    assert blind.status is Status.ERROR and blind.reason == "unverifiable"
    assert seeing.status is Status.VERIFYING


async def test_current_agent_is_set_only_while_the_agent_runs(outbox_factory):
    agent = Recorder("only")
    outbox = outbox_factory(agents={"only": agent.agent()})
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    assert agent.served_as == ["only"] and current_agent.get() is None


@pytest.fixture
async def outbox_factory(make_outbox):
    """Outboxes whose verifications are due at once and whose retries wait 5 s (so a
    run's ``once`` ends before a retry); their async clients closed at teardown."""
    made = []

    def make(**kwargs):
        outbox = make_outbox(
            retry_backoff=5,
            max_backoff=10,
            verify_delay=0,
            verify_backoff=0,
            max_verify_backoff=0.2,
            **kwargs,
        )
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        await outbox.aclose()


async def test_an_operators_retry_of_an_unverifiable_entry_asks_its_agents_verifier(
    outbox_factory,
):
    unsure = Recorder("unsure")
    unsure.ambiguous_once.add("t")

    def undecided(entry, **kwargs):
        return Verdict.INCONCLUSIVE

    agent = Agent("unsure", unsure.deliver, undecided)
    outbox = outbox_factory(agents={"unsure": agent}, max_verify_attempts=1)
    entry = await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")  # ambiguous
    assert await outbox.adeliver_once(WS, "s")  # inconclusive, the last pass
    [stuck] = await outbox.alist(WS, "s")
    assert stuck.status is Status.ERROR and stuck.reason == "unverifiable"
    # Only the agent has a verifier (no single VERIFIER): a retry still verifies first.
    await outbox.aretry(WS, "s", entry.id)
    [retried] = await outbox.alist(WS, "s")
    assert retried.status is Status.VERIFYING
    assert await outbox.adeliver_once(WS, "s")  # a verification, not a send
    assert unsure.delivered == [("s", "t")]


async def test_the_unverifiable_sweep_runs_when_only_an_agent_has_a_verifier(outbox_factory):
    unsure = Recorder("unsure")
    unsure.ambiguous_once.add("t")
    agent = Agent("unsure", unsure.deliver, lambda entry, **kw: Verdict.INCONCLUSIVE)
    outbox = outbox_factory(agents={"unsure": agent}, max_verify_attempts=1)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    assert await outbox.adeliver_once(WS, "s")
    assert await outbox.asweep_workspace_unverifiable(WS) == 1
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.VERIFYING


async def test_a_retry_while_the_sessions_agent_cannot_be_found_still_verifies_first(
    outbox_factory,
):
    unsure = Recorder("unsure")
    unsure.ambiguous_once.add("t")
    agent = Agent("unsure", unsure.deliver, lambda entry, **kw: Verdict.INCONCLUSIVE)
    route = {"name": "unsure"}
    outbox = outbox_factory(
        agents={"unsure": agent}, router=lambda ws, ses: route["name"], max_verify_attempts=1
    )
    entry = await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    assert await outbox.adeliver_once(WS, "s")
    route["name"] = "renamed"  # a settings change in flight
    await outbox.aretry(WS, "s", entry.id)
    [retried] = await outbox.alist(WS, "s")
    assert retried.status is Status.VERIFYING  # never resent on a guess
