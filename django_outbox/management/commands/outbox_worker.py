"""``manage.py outbox_worker``: deliver accepted messages until SIGTERM or SIGINT.

See docs/reference/commands.md#outbox_worker.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from django_outbox.conf import outbox_settings
from django_outbox.core.redaction import RedactingFilter, redact
from django_outbox.errors import (
    AgentMisconfigured,
    KeySpaceClaimed,
    KeySpaceTakenOver,
    OutboxUnavailable,
    ServerUnsupported,
)
from django_outbox.outbox import get_outbox
from django_outbox.signals import entry_delivered

logger = logging.getLogger("django_outbox.worker")

CONNECT_ATTEMPTS = 5


class Command(BaseCommand):
    # The outbox's own checks (reachability, eviction policy) are done by the
    # preflight below, which --allow-eviction can override; the rest run as usual.
    requires_system_checks: list[str] = []

    help = (
        "Deliver accepted outbox messages: FIFO per session, one in flight per session. "
        "Stops claiming on SIGTERM/SIGINT, lets in-flight deliveries finish for --grace "
        "seconds, then exits 0."
    )

    def add_arguments(self, parser):
        config = outbox_settings().config
        parser.add_argument(
            "--concurrency",
            type=int,
            default=config.concurrency,
            help=f"sessions delivered at once (default CONCURRENCY = {config.concurrency})",
        )
        parser.add_argument(
            "--tick",
            type=float,
            default=config.tick,
            help=f"seconds between due-index scans (default TICK = {config.tick})",
        )
        parser.add_argument(
            "--once", action="store_true", help="deliver what is due now, then exit"
        )
        parser.add_argument(
            "--grace",
            type=float,
            default=30.0,
            help="seconds in-flight deliveries may finish after a stop signal (default 30)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="serve Prometheus metrics on this port (127.0.0.1 unless --metrics-host)",
        )
        parser.add_argument("--metrics-host", default="127.0.0.1")
        parser.add_argument(
            "--check",
            action="store_true",
            help="exit 0 if a live worker heartbeat exists, else 1 (a health probe)",
        )
        parser.add_argument(
            "--allow-eviction",
            action="store_true",
            help="start even if Valkey's maxmemory-policy is not noeviction (queued messages "
            "may be silently evicted)",
        )

    def handle(self, *args, **options):
        from django.core.checks.registry import registry

        if not options.get("skip_checks"):
            self.check(tags=sorted(registry.tags_available() - {"outbox"}))
        self._configure_logging(options["verbosity"])
        outbox = get_outbox()
        if options["check"]:
            return self._check(outbox)
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["tick"] <= 0:
            raise CommandError("--tick must be positive")
        if options["grace"] < 0:
            raise CommandError("--grace must not be negative")
        if outbox.deliverer is None and not outbox.agents:
            raise CommandError(
                "no deliverer: set OUTBOX['DELIVERER'] to a callable or dotted path "
                "(e.g. 'django_outbox.delivery.opencode.deliver'), or OUTBOX['AGENTS']"
            )
        self._preflight(outbox, options["allow_eviction"])
        if options["metrics_port"] is not None:
            self._serve_metrics(outbox, options["metrics_host"], options["metrics_port"])
        try:
            stats = asyncio.run(self._run(outbox, options))
        except KeySpaceTakenOver as exc:  # another project's claim --force, while it ran
            raise CommandError(
                f"outbox_worker stopped: {redact(str(exc))}. 'python manage.py check' says "
                "how to fix it."
            ) from None
        except KeySpaceClaimed as exc:  # raised by the start, before anything is delivered
            raise _refused(exc) from None
        except ServerUnsupported as exc:  # the same: the server cannot do what is asked
            raise _unsupported(exc) from None
        except AgentMisconfigured as exc:  # an agent's start-up probe said no
            raise CommandError(
                f"outbox_worker refuses to start: {redact(str(exc))} "
                "(docs/howto/agents.md#the-start-up-probe)"
            ) from None
        self.stdout.write(f"outbox_worker stopped: {stats.summary()}")

    async def _run(self, outbox, options):
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(signum):
            if stop.is_set():
                return
            logger.info(
                "outbox worker: %s received; no new claims, %ss grace for in-flight deliveries",
                signal.Signals(signum).name,
                options["grace"],
            )
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            return await outbox.arun(
                concurrency=options["concurrency"],
                tick=options["tick"],
                stop=stop,
                grace=options["grace"],
                once=options["once"],
            )
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            await outbox.aclose()
            opencode = sys.modules.get("django_outbox.delivery.opencode")
            if opencode is not None:
                await opencode.aclose()
            http = sys.modules.get("django_outbox.delivery.http")
            if http is not None:
                await http.aclose()
            langgraph = sys.modules.get("django_outbox.delivery.langgraph")
            if langgraph is not None:
                await langgraph.aclose()

    def _preflight(self, outbox, allow_eviction: bool) -> None:
        """Refuse to start against an unreachable or evicting Valkey (on a cluster, any
        evicting primary). The worker's start then refuses a server that cannot do what
        the settings ask (docs/howto/valkey.md#supported-servers), and claims the key
        space, or refuses one another project claimed
        (docs/howto/valkey.md#one-project-per-key-space)."""
        delay = 0.2
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                servers = outbox.server_settings()
                break
            except Exception as exc:
                if attempt == CONNECT_ATTEMPTS:
                    raise CommandError(
                        f"Valkey at {redact(outbox.url)} is unreachable after "
                        f"{CONNECT_ATTEMPTS} attempts: {redact(str(exc))}"
                    ) from None  # the chained traceback would show what the message hides
                logger.warning(
                    "outbox worker: Valkey unreachable (%s); retrying in %.1fs", exc, delay
                )
                time.sleep(delay)
                delay *= 2
        policies = [server.maxmemory_policy or "unknown" for server in servers]
        policy = next((p for p in policies if p != "noeviction"), None)
        if policy is not None:
            message = (
                f"Valkey's maxmemory-policy is {policy!r}, not 'noeviction': an evicting server "
                "silently deletes queued messages, leases and dedupe markers. Set "
                "'maxmemory-policy noeviction'"
            )
            if not allow_eviction:
                raise CommandError(message + " (or pass --allow-eviction to start anyway).")
            self.stderr.write(
                self.style.WARNING("WARNING: " + message + "; --allow-eviction given.")
            )
            logger.warning(message)

    def _check(self, outbox) -> None:
        try:
            live = outbox.live_workers()
        except OutboxUnavailable as exc:
            raise CommandError(redact(str(exc)), returncode=1) from exc
        except Exception as exc:
            raise CommandError(f"Valkey unreachable: {redact(str(exc))}", returncode=1) from exc
        if not live:
            raise CommandError("no live outbox worker", returncode=1)
        for worker in live:
            self.stdout.write(f"live: {worker.id} pid={worker.pid} in_flight={worker.in_flight}")

    def _serve_metrics(self, outbox, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        from django_outbox.metrics import WorkerMetrics

        metrics = WorkerMetrics(outbox)
        outbox.step_listeners.append(metrics.on_step)
        outbox.agent_step_listeners.append(metrics.on_agent_step)
        entry_delivered.connect(metrics.on_delivered, weak=False, dispatch_uid="outbox-metrics")
        start_http_server(port, addr=host, registry=metrics.registry)
        logger.info("outbox worker: metrics on http://%s:%d/metrics", host, port)

    def _configure_logging(self, verbosity: int) -> None:
        root = logging.getLogger("django_outbox")
        if root.handlers or logging.getLogger().handlers:
            return
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(RedactingFilter())  # every record it writes, whichever package logger
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        root.addHandler(handler)
        root.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))


def _refused(exc: KeySpaceClaimed) -> CommandError:
    return CommandError(
        f"outbox_worker refuses to start: {redact(str(exc))}. 'python manage.py check' "
        "says how to fix it; 'python manage.py outbox claim --force' takes the key space "
        "over once the other project's workers are stopped."
    )


def _unsupported(exc: ServerUnsupported) -> CommandError:
    return CommandError(
        f"outbox_worker refuses to start: {redact(str(exc))} 'python manage.py check' "
        "reports the same (django_outbox.E007)."
    )
