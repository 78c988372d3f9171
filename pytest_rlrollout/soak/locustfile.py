"""The Locust side of a soak: rollout workers as Locust users, and the hub that ties them to the
soak's trainer and judge, which run in another process (`soak.run`).

Only Locust runs this file (`locust -f`): importing locust patches the whole process for gevent,
which the soak's own process (threads, asyncio, pytest) must never be. Two roles:

- the hub (the Locust master; in a one-process soak, the same process as the rollouts) reads
  the soak's orders on its stdin, one JSON object a line (a swap signalled, a swap served,
  stop), and passes what a worker must hear to every worker; it passes every worker's turns
  to its stdout, one `SOAK {json}` line a batch;
- the rollouts (each worker) run `Rollout` users, one simulated agentic rollout after another,
  and note for every turn what they had heard of the swaps when they sent it, when each chunk
  came and when it ended (`judge.Turn`).

At stop the hub asks every worker to drain: a worker starts no new turn, lets its turns in
flight end, sends the last of them and its own figures, and the hub prints those before it
quits. So the soak's merged figures are exactly the sum of the workers' (Locust's own end-of-run
report waits only half a second for the workers' last numbers).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import sys
import time
import zlib
from typing import Any

import gevent
from gevent.event import Event
from gevent.fileobject import FileObjectPosix
from locust import User, constant, events, task
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner

# httpcore (under httpx) imports trio when it is installed, to support it as a backend; trio
# needs select.epoll at import, which gevent's patching removed from this process. Nothing here
# runs on trio: its import fails as if it were not installed, and httpcore goes on without it.
sys.modules.setdefault("trio", None)  # type: ignore[arg-type]

from pytest_rlrollout.remote.client import DeploymentClient
from pytest_rlrollout.remote.discovery import Discovery
from pytest_rlrollout.remote.drivers import driver_for
from pytest_rlrollout.remote.limits import LimitExceeded
from pytest_rlrollout.remote.secret import Secret
from pytest_rlrollout.remote.target import Target
from pytest_rlrollout.remote.transport import ExchangeFailed
from pytest_rlrollout.soak.figures import Figures, Timed
from pytest_rlrollout.soak.judge import Heard, Turn
from pytest_rlrollout.soak.plan import EVENT_PREFIX, KEY_ENV, PARENT_ENV, PLAN_ENV, SESSION_HEADER, Plan
from pytest_rlrollout.soak.rollouts import Trajectory

BATCH = 32  # turns a worker sends at once
FLUSH_EVERY = 0.5  # seconds: a worker sends what it has at least this often, so judging keeps up
EXCHANGE = 800  # characters of a turn's exchange kept (the evidence when it breaks a clause)


PARENT_CHECK = 0.5  # seconds between two looks at whether the soak's process is still there


def emit(doc: dict[str, Any]) -> None:
    """A line for the soak; if nobody reads them any more (the soak's process is gone), this
    process ends."""
    try:
        sys.stdout.write(EVENT_PREFIX + json.dumps(doc) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _soak_gone()


def _soak_gone() -> None:
    """The soak that started this process is gone: end the way Locust ends on SIGTERM (a master
    tells its workers to quit, a worker tells its master), with no drain, as nobody is left to
    read its books."""
    os.kill(os.getpid(), signal.SIGTERM)


def _watching_the_soak(parent: int) -> None:
    """End this process once its parent, the soak's process, is gone: however the soak ended
    (SIGKILL included), no Locust process of its outlives it. Workers on other machines are not
    the soak's children and are not watched."""
    while os.getppid() == parent:
        gevent.sleep(PARENT_CHECK)  # a pace: no event says that a parent died
    _soak_gone()


class Rollouts:
    """A worker's side: the plan, what it heard of the swaps and when, its turns and figures."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self.name = f"{socket.gethostname()}-{os.getpid()}"
        self.heard = Heard()
        self.served_at: list[tuple[float, int]] = [(-float("inf"), 0)]  # (when heard, epoch), in order
        self.figures = Figures()
        self.batch: list[dict[str, Any]] = []
        self.inflight = 0
        self.draining = False
        self.idle = Event()
        self.planned = Event()
        self.offset = 0.0
        self.users = 0

    def clock(self) -> float:
        """Seconds since the soak started, on this worker's clock (monotonic, offset once)."""
        return time.monotonic() + self.offset

    def take_plan(self, doc: dict[str, Any]) -> None:
        self.plan = Plan.from_json(doc)
        self.offset = time.time() - time.monotonic() - self.plan.t0
        self.planned.set()

    def hear(self, signalled: int, served: int) -> None:
        if served > self.heard.served:
            self.served_at.append((self.clock(), served))
        self.heard = Heard(max(signalled, self.heard.signalled), max(served, self.heard.served))

    def settled(self, now: float) -> int:
        """The last swap this worker heard was served everywhere at least `grace` before `now`."""
        assert self.plan is not None
        return max(e for at, e in self.served_at if at <= now - self.plan.grace)

    def record(self, timed: Timed, runner: Any) -> None:
        self.figures.record(timed)
        self.batch.append(timed.to_json())
        if len(self.batch) >= BATCH:
            self.flush(runner)

    def flush(self, runner: Any) -> None:
        if self.batch:
            batch, self.batch = self.batch, []
            runner.send_message("soak_turns", batch)

    def drain(self, runner: Any) -> None:
        """Start no new turn, let those in flight end, send the last turns and this worker's figures."""
        self.draining = True
        if self.inflight:
            self.idle.clear()
            self.idle.wait(timeout=(self.plan.timeout if self.plan else 0) + 5)
        self.flush(runner)
        runner.send_message(
            "soak_final", {"worker": self.name, "figures": self.figures.to_json(), "inflight": self.inflight}
        )


class Hub:
    """The master's side: orders in from the soak, heard swaps out to the workers, turns back."""

    def __init__(self, environment: Any, plan: Plan):
        self.environment, self.plan = environment, plan
        self.heard = Heard()
        self.finals: dict[str, dict[str, Any]] = {}
        self.all_final = Event()
        self.expected = 1

    @property
    def runner(self) -> Any:
        return self.environment.runner

    def hello(self, environment: Any, msg: Any, **_: Any) -> None:
        """A worker is ready for its plan (asked by the worker: Locust's worker_connect comes
        before a worker has registered what it listens to, so a plan sent then is lost)."""
        self.runner.send_message("soak_plan", self.plan.to_json(), msg.node_id)
        self.runner.send_message("soak_heard", [self.heard.signalled, self.heard.served], msg.node_id)

    def orders(self) -> None:
        """Read the soak's orders until stop (or until the soak is gone: its end of the pipe closed)."""
        stdin = FileObjectPosix(sys.stdin.fileno(), "rb", close=False)
        for line in stdin:
            order = json.loads(line)
            if "stop" in order:
                break
            self.heard = Heard(
                int(order.get("signalled", self.heard.signalled)), int(order.get("served", self.heard.served))
            )
            self.runner.send_message("soak_heard", [self.heard.signalled, self.heard.served])
        self.stop()

    def turns(self, environment: Any, msg: Any, **_: Any) -> None:
        emit({"turns": msg.data})

    def final(self, environment: Any, msg: Any, **_: Any) -> None:
        self.finals[msg.data["worker"]] = msg.data
        emit({"final": msg.data})
        if len(self.finals) >= self.expected:
            self.all_final.set()

    def stop(self) -> None:
        self.expected = len(self.runner.clients) if isinstance(self.runner, MasterRunner) else 1
        self.runner.send_message("soak_drain", None)
        self.all_final.wait(timeout=self.plan.timeout + 15)
        emit({"finished": {"workers": self.expected, "finals": len(self.finals)}})
        self.runner.quit()


ROLLOUTS = Rollouts()


@events.init.add_listener
def _init(environment: Any, runner: Any, **_: Any) -> None:
    if os.environ.get(PARENT_ENV):
        gevent.spawn(_watching_the_soak, int(os.environ[PARENT_ENV]))
    if not isinstance(runner, WorkerRunner):  # the master, or a one-process soak
        path = os.environ.get(PLAN_ENV)
        if not path:
            raise SystemExit(f"{PLAN_ENV} names no plan: the hub is started by the soak (rlrollout soak)")
        with open(path) as f:
            hub = Hub(environment, Plan.from_json(json.load(f)))
        runner.register_message("soak_turns", hub.turns)
        runner.register_message("soak_final", hub.final)
        if isinstance(runner, MasterRunner):
            runner.register_message("soak_hello", hub.hello)
            emit({"master": runner.server.port})
        else:
            ROLLOUTS.take_plan(hub.plan.to_json())
        environment.events.spawning_complete.add_listener(lambda user_count, **_: emit({"spawned": user_count}))
        gevent.spawn(hub.orders)
    if not isinstance(runner, MasterRunner):  # a worker, or a one-process soak
        runner.register_message("soak_plan", lambda environment, msg, **_: ROLLOUTS.take_plan(msg.data))
        runner.register_message("soak_heard", lambda environment, msg, **_: ROLLOUTS.hear(*msg.data))
        runner.register_message("soak_drain", lambda environment, msg, **_: gevent.spawn(ROLLOUTS.drain, runner))
        gevent.spawn(_flushing, runner)
        if isinstance(runner, WorkerRunner):
            # locust annotates a worker's message data as a dict; it sends any msgpack value (its Runner: Any)
            runner.send_message("soak_hello", ROLLOUTS.name)  # type: ignore[arg-type]


def _flushing(runner: Any) -> None:
    while not ROLLOUTS.draining:
        gevent.sleep(FLUSH_EVERY)  # a pace, not a wait for a condition
        ROLLOUTS.flush(runner)


class Rollout(User):
    """One rollout worker: simulated agentic rollouts, one after another, each on a session of its own."""

    wait_time = constant(0)

    def on_start(self) -> None:
        ROLLOUTS.planned.wait(timeout=30)
        if ROLLOUTS.plan is None:
            raise RuntimeError("no soak plan came from the master")
        p = ROLLOUTS.plan
        ROLLOUTS.users += 1
        self.number, self.rollouts = ROLLOUTS.users, 0
        target = Target(
            p.deployment,
            p.base_url,
            p.model,
            Secret(os.environ.get(KEY_ENV, "")),
            inference_url=p.inference_url,
            engine=p.engine,
            members=p.members,
        )
        self.client = DeploymentClient(target, timeout=p.timeout)
        self.driver = driver_for(p.engine, self.client, bucket=p.bucket)
        if p.discovery is not None:
            self.driver.adopt(Discovery.from_dict(p.discovery))

    def on_stop(self) -> None:
        self.client.close()

    @task
    def rollout(self) -> None:
        if ROLLOUTS.draining:
            raise StopUser()
        p = ROLLOUTS.plan
        assert p is not None
        self.rollouts += 1
        session = f"{ROLLOUTS.name}-u{self.number}-r{self.rollouts}"
        t = Trajectory(
            session,
            zlib.crc32(f"{p.seed}/{session}".encode()),
            p.vocab,
            turns=p.turns,
            max_tokens=p.max_tokens,
            max_context=p.max_context,
            routing=p.routing,
        )
        think = random.Random(t.seed)
        while not t.done and not ROLLOUTS.draining:
            completion = self.turn(t)
            if completion is None:
                return  # the turn failed: a rollout cannot go on without its completion
            t.answered(completion)
            gevent.sleep(think.uniform(*p.think))  # the environment's step between turns

    def turn(self, t: Trajectory) -> list[int] | None:
        """One streamed turn, noted and sent on; the completion's token ids (None: none to go on with)."""
        sent, sent_at = ROLLOUTS.heard, ROLLOUTS.clock()
        chunk_at: list[float] = []
        settled: list[int] = []

        def on_chunk(_: dict[str, Any]) -> None:
            now = ROLLOUTS.clock()
            chunk_at.append(now)
            settled.append(ROLLOUTS.settled(now))

        ROLLOUTS.inflight += 1
        try:
            stream = self.driver.complete(t.request(), headers={SESSION_HEADER: t.session}, on_chunk=on_chunk)
            failure = None
        except (ExchangeFailed, LimitExceeded) as e:
            stream, failure = None, e
        finally:
            ROLLOUTS.inflight -= 1
            if not ROLLOUTS.inflight:
                ROLLOUTS.idle.set()
        ended = ROLLOUTS.heard
        exchange = self.client.exchanges[-1].text()[:EXCHANGE] if self.client.exchanges else ""
        if stream is None:
            turn = Turn(ROLLOUTS.name, t.session, t.index, sent, ended, 0, exchange=exchange or str(failure)[:EXCHANGE])
            tokens: tuple[int, ...] = ()
            chunk_at = []
        else:
            turn = Turn.seen(
                stream,
                worker=ROLLOUTS.name,
                session=t.session,
                index=t.index,
                sent=sent,
                ended=ended,
                exchange=exchange,
                settled=tuple(settled),
            )
            tokens = tuple(len(stream.reading.entries([c])) for c in stream.chunks)
        ROLLOUTS.record(Timed(turn, sent_at, tuple(chunk_at), tokens), self.environment.runner)
        self.environment.events.request.fire(
            request_type="STREAM",
            name="turn",
            response_time=(ROLLOUTS.clock() - sent_at) * 1000,
            response_length=turn.tokens,
            context={},
            exception=None if turn.status == 200 else RuntimeError(f"answered {turn.status or 'nothing'}"),
        )
        if stream is None or stream.status != 200:
            return None
        ids = [e.get("token_id") for e in stream.entries]
        if not ids or not all(type(i) is int for i in ids) or len(ids) > t.max_tokens:
            return None
        return ids  # type: ignore[return-value]
