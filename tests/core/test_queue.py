"""The database queue on SQLite and PostgreSQL: order, memory fit, racing workers, orphans, and the
Celery wake-up sent by name."""
from __future__ import annotations

import threading

from redis import Redis
from sqlalchemy import select

from lanner.core.models import Job, JobKind, JobStatus
from lanner.core.queue.claim import DISPATCH_TASK, claim_next_job, has_runnable_job, sweep_orphaned_jobs, wake_workers
from lanner.core.queue.order import fair_queue_order
from lanner.core.settings import Settings
from lanner.core.spec import MAX_REQUEUES

from job_specs import stored_spec
from queue_helpers import CPU, GIB, add_job, add_user, make_db
from support import WORKER_REDIS_URL


def test_claims_in_priority_then_queue_order_and_skips_what_does_not_fit(database_url):
    factory, owner = make_db(database_url)
    with factory() as session:
        low = add_job(session, owner, "low", priority=0, queue_order=1)
        high_late = add_job(session, owner, "high late", priority=5, queue_order=2)
        high_early = add_job(session, owner, "high early", priority=5, queue_order=1)
        too_big = add_job(session, owner, "too big", priority=9, memory_estimate_bytes=64 * GIB)
        export = add_job(session, owner, "export", priority=9, kind=JobKind.export)  # exports queue alike
        add_job(session, owner, "two gpus", priority=9, gpus=2)
        tie = add_job(session, owner, "tie", priority=0, queue_order=1)
        fits = add_job(session, owner, "fits", priority=0, queue_order=0, memory_estimate_bytes=2 * GIB)

    with factory() as session:
        assert has_runnable_job(session, CPU)
        claimed = []
        while (job := claim_next_job(session, "cpu0@test", CPU)) is not None:
            assert job.status == JobStatus.running and job.worker == "cpu0@test" and job.device == CPU.record()
            assert job.started_at is not None
            claimed.append(job.id)
    assert claimed == [export, high_early, high_late, fits, low, tie]
    with factory() as session:
        assert session.get(Job, too_big).status == JobStatus.queued
        assert not has_runnable_job(session, CPU)
        big = CPU.model_copy(update={"memory_total_bytes": 80 * GIB})
        assert has_runnable_job(session, big)
        assert claim_next_job(session, "gpu0@test", big).id == too_big
        assert claim_next_job(session, "gpu0@test", big) is None


def test_owners_take_turns_so_a_twenty_job_sweep_does_not_starve_another_users_job(database_url):
    factory, alice = make_db(database_url)
    with factory() as session:
        bob, carol = add_user(session), add_user(session)

        def queue(owner: int, name: str, priority: int = 0) -> int:
            return add_job(session, owner, name, priority=priority, status=JobStatus.queued,
                           queue_order=fair_queue_order(session, owner, priority))

        sweep = [queue(alice, f"run {i}") for i in range(20)]
        bobs = [queue(bob, "bob 1"), queue(bob, "bob 2")]
        carols = queue(carol, "carol")
        urgent = queue(alice, "urgent", priority=5)  # a band of its own, first
        alices_next = queue(alice, "after the sweep")
    with factory() as session:
        claimed = []
        while (job := claim_next_job(session, "cpu0@test", CPU)) is not None:
            claimed.append(job.id)
    assert claimed == [urgent, sweep[0], bobs[0], carols, sweep[1], bobs[1], *sweep[2:], alices_next]


def test_racing_workers_never_take_the_same_job(database_url):
    factory, owner = make_db(database_url)
    with factory() as session:
        ids = [add_job(session, owner, f"job {i}", queue_order=i) for i in range(24)]
    taken: dict[str, list[int]] = {}
    start = threading.Barrier(4)

    def worker(name: str) -> None:
        mine = taken.setdefault(name, [])
        with factory() as session:
            start.wait()
            while (job := claim_next_job(session, name, CPU)) is not None:
                mine.append(job.id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    everything = [job_id for jobs in taken.values() for job_id in jobs]
    assert sorted(everything) == ids, taken
    with factory() as session:
        rows = session.execute(select(Job.id, Job.worker)).all()
        assert all(worker_name in taken and job_id in taken[worker_name] for job_id, worker_name in rows)


def test_orphaned_running_jobs_are_failed_or_requeued_in_one_commit(database_url):
    factory, owner = make_db(database_url)
    lost = {"status": JobStatus.running, "worker": "gpu1@a"}
    with factory() as session:
        alive = add_job(session, owner, "alive", status=JobStatus.running, worker="gpu0@a", config=stored_spec())
        opted_out = add_job(session, owner, "opted out", config=stored_spec(overrides={"requeue_on_worker_loss": False}),
                            **lost)
        resumable = add_job(session, owner, "resumable", config=stored_spec(), **lost)
        fresh = add_job(session, owner, "no checkpoint yet", config=stored_spec(), resume_from="checkpoint-1", **lost)
        exhausted = add_job(session, owner, "exhausted", config=stored_spec(), requeues=MAX_REQUEUES, **lost)
        restarted = add_job(session, owner, "restarted", status=JobStatus.running, worker="cpu0@b",
                            kind=JobKind.export, config={"export": {}})
        queued = add_job(session, owner, "queued", config=stored_spec())
    seen = []  # the statuses another connection reads while the sweep decides

    def resume_point(job):
        with factory() as other:
            seen.append({job_id: other.get(Job, job_id).status for job_id in (opted_out, resumable)})
        return "checkpoint-3" if job.id in (resumable, exhausted) else None

    with factory() as session:
        swept = sweep_orphaned_jobs(session, {"gpu0@a", "cpu0@b"}, resume_point=resume_point)
        assert sorted(swept) == [opted_out, resumable, fresh, exhausted]
        assert sweep_orphaned_jobs(session, {"gpu0@a", "cpu0@b"}, only_worker="cpu0@b") == [restarted]
    # Nothing was committed before every job was decided: the requeued job was never failed to a reader.
    assert seen == [{opted_out: JobStatus.running, resumable: JobStatus.running}] * 3
    with factory() as session:
        jobs = {job.id: job for job in session.execute(select(Job)).scalars()}
        assert {job_id: job.status for job_id, job in jobs.items()} == {
            alive: JobStatus.running, opted_out: JobStatus.failed, resumable: JobStatus.queued,
            fresh: JobStatus.queued, exhausted: JobStatus.failed, restarted: JobStatus.failed,
            queued: JobStatus.queued}
        assert "gpu1@a stopped" in jobs[opted_out].error and jobs[opted_out].requeues == 0
        assert (jobs[resumable].resume_from, jobs[resumable].requeues, jobs[resumable].error,
                jobs[resumable].worker) == ("checkpoint-3", 1, None, None)
        # Lost before its first checkpoint: it starts again from where it started (here, a retry's checkpoint).
        assert (jobs[fresh].resume_from, jobs[fresh].requeues) == ("checkpoint-1", 1)
        assert jobs[exhausted].error == (
            "The worker gpu1@a stopped while running this job (killed or crashed); the job did not finish. "
            f"Its worker was lost {MAX_REQUEUES + 1} times: after {MAX_REQUEUES} requeues it is not queued again, "
            "in case the job itself takes its worker down. Its newest checkpoint, checkpoint-3, is kept: "
            "retry from it once the cause is found.")
        assert jobs[exhausted].finished_at is not None


def test_wake_workers_sends_the_dispatch_task_by_name(tmp_path):
    redis_url = WORKER_REDIS_URL
    redis = Redis.from_url(redis_url, decode_responses=True)
    redis.delete("celery")
    try:
        assert wake_workers(Settings(data_dir=tmp_path, redis_url=redis_url)) is True
        message = redis.lpop("celery")
        assert message and DISPATCH_TASK in message
    finally:
        redis.delete("celery")
    # Nothing listening at all: the API carries on, the job stays queued in the database.
    assert wake_workers(Settings(data_dir=tmp_path, redis_url="redis://127.0.0.1:1/0")) is False
