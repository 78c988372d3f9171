"""The bucket on an object store over the real S3 wire: moto's server (as s3fs's own tests use
it), reached through the endpoint and credentials a run's settings name. Uploads go several
files at once with a progress line; a refused key, a bucket that is not there and an upload
cut half-way each end in one clear error, and no cut upload leaves a snapshot to load."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from pytest_rlrollout.remote.bucket import LAST, Bucket, BucketError, Store, Transfer
from pytest_rlrollout.snapshot import tiny_moe
from pytest_rlrollout.suite.options import CONFORMANCE

from ..support import FAST_POLLS

pytest.importorskip("s3fs", reason="the s3 extra (pip install 'pytest-rlrollout[s3]')")
moto_server = pytest.importorskip("moto.moto_server.threaded_moto_server", reason="moto[server] (the test extra)")

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "rl-test-key",
    "AWS_SECRET_ACCESS_KEY": "rl-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3(monkeypatch, tmp_path):
    """moto's S3 server on a free port of this machine, with a bucket `rl-bucket`; credentials
    in the environment, as a user's shell would have them."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials-file"))
    with socket.socket() as s:  # a port of its own, the same again if the test restarts the server
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    httpx.put(f"{endpoint}/rl-bucket").raise_for_status()
    yield endpoint, server
    server.stop()


def store(endpoint: str, **kw) -> Store:
    # one attempt: a store that does not answer says so at once instead of after minutes of retries
    return Store(
        endpoint_url=endpoint,
        options={"skip_instance_cache": True, "config_kwargs": {"retries": {"max_attempts": 1}}},
        **kw,
    )


def snapshot_files(base_snapshot) -> dict:
    return {f.name: f for f in sorted(base_snapshot.iterdir())}


def test_an_upload_runs_several_files_at_once_and_says_how_far_it_is(s3, base_snapshot):
    """Two files are provably in flight together (each waits for the other before it is sent);
    the progress line ends with every byte and file counted."""
    endpoint, _ = s3
    lines = []
    bucket = Bucket("s3://rl-bucket/snapshots", store(endpoint, concurrency=4), progress=lines.append)
    together = threading.Barrier(2, timeout=20)
    put_file = bucket.fs.put_file
    calls = iter(range(1000))

    def paired(*args, **kw):
        if next(calls) < 2:
            together.wait()  # BrokenBarrierError, and the test fails, unless a second file is in flight
        return put_file(*args, **kw)

    bucket.fs.put_file = paired
    files = snapshot_files(base_snapshot)
    done = bucket.put("rlt-0123abcd-abcdef-01-x", files, link=False)
    assert done.most_in_flight >= 2 and done.files == len(files)
    assert done.sent == sum(f.stat().st_size for f in files.values())
    last = lines[-1]
    assert last.done == last.total == done.sent and last.files_done == last.files == len(files)
    assert last.line().startswith("uploading rlt-0123abcd-abcdef-01-x: ")
    assert sorted(bucket.fs.ls("rl-bucket/snapshots/rlt-0123abcd-abcdef-01-x", detail=False)) == sorted(
        f"rl-bucket/snapshots/rlt-0123abcd-abcdef-01-x/{n}" for n in files
    )


def test_files_the_store_holds_are_copied_by_the_store(s3, base_snapshot):
    """A snapshot that shares files with one in the bucket sends only what differs."""
    endpoint, _ = s3
    bucket = Bucket("s3://rl-bucket", store(endpoint))
    files = snapshot_files(base_snapshot)
    bucket.put("base", files, link=False)
    changed = {"config.json": files["config.json"]}
    same = {n: f for n, f in files.items() if n != "config.json"}
    done = bucket.put("next", changed, same=same, source="base")
    assert done.sent == files["config.json"].stat().st_size
    assert done.copied == sum(f.stat().st_size for f in same.values())


def test_refused_credentials_are_one_clear_error(s3):
    """With the store checking keys (moto's auth switched on), a key it does not know is refused
    at the first question, named as such."""
    endpoint, _ = s3
    httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"0").raise_for_status()
    try:
        with pytest.raises(BucketError, match="refused these credentials"):
            Bucket("s3://rl-bucket", store(endpoint)).check()
    finally:
        httpx.post(f"{endpoint}/moto-api/reset-auth", content=b"inf")


def test_a_bucket_that_does_not_exist_is_one_clear_error(s3):
    endpoint, _ = s3
    with pytest.raises(BucketError, match="does not exist"):
        Bucket("s3://no-such-bucket", store(endpoint)).check()
    Bucket("s3://rl-bucket", store(endpoint)).check()  # the one that does


def test_an_upload_cut_half_way_leaves_no_snapshot_to_load(s3, base_snapshot):
    """The store goes away after two files: the put fails with one error saying what is left and
    how to remove it, and what is left has no index, config or spec (they go last), so no
    deployment would load it."""
    endpoint, server = s3
    bucket = Bucket("s3://rl-bucket", store(endpoint, concurrency=1))
    put_file = bucket.fs.put_file
    sent = []

    def cut(*args, **kw):
        if len(sent) == 2:
            server.stop()
        sent.append(args[1])
        return put_file(*args, **kw)

    bucket.fs.put_file = cut
    with pytest.raises(BucketError) as e:
        bucket.put("rlt-0123abcd-abcdef-01-cut", snapshot_files(base_snapshot), link=False)
    assert "upload of rlt-0123abcd-abcdef-01-cut" in str(e.value) and "rlrollout cleanup" in str(e.value)
    server.start()  # the same process: moto keeps what it was sent
    left = [
        p.rsplit("/", 1)[1]
        for p in Bucket("s3://rl-bucket", store(endpoint)).fs.find("rl-bucket/rlt-0123abcd-abcdef-01-cut")
    ]
    assert len(left) == 2 and not set(left) & set(LAST), left


def test_credentials_never_go_in_a_setting():
    """A key in the storage options would land in git and in reports: refused, saying where
    keys belong."""
    with pytest.raises(ValueError, match="environment or a profile"):
        Bucket("s3://rl-bucket", Store(options={"secret": "x"}))
    with pytest.raises(ValueError, match="s3:// and gs://"):
        Bucket("/tmp", Store(endpoint_url="http://127.0.0.1:1"))


def test_a_run_whose_bucket_is_on_the_object_store(s3, pytester, serve, tmp_path):
    """`rlrollout serve` downloading its snapshots from moto's S3 (as a hosted deployment reads
    its bucket); the suite's settings name the endpoint, the credentials come from the
    environment. Every swap test is judged with its snapshots put over the S3 wire: the base
    copies made by the store, the rest sent with a progress line."""
    endpoint, _ = s3
    served = serve(
        "--bucket", tmp_path / "cache", "--bucket-url", "s3://rl-bucket/deployment", "--bucket-endpoint-url", endpoint
    )
    command = served.named("conformance").removeprefix("rlrollout conformance ").split()
    assert "--rl-bucket-url=s3://rl-bucket/deployment" in command
    assert f"rl_bucket_endpoint_url={endpoint}" in command
    modules = [str(CONFORMANCE / m) for m in ("test_swap.py", "test_fidelity.py")]
    result = pytester.runpytest_inprocess(*modules, "-p", "no:randomly", *command, *FAST_POLLS, "--rl-report=r.json")
    assert result.ret == 0, "\n".join(result.outlines[-30:])
    doc = json.loads((pytester.path / "r.json").read_text())
    outcomes = {k: v["outcome"] for k, v in doc["clauses"].items()}
    assert set(outcomes.values()) <= {"pass", "not-applicable"}, json.dumps(
        {k: c for k, c in doc["clauses"].items() if c["outcome"] not in ("pass", "not-applicable")}, indent=1
    )
    uploads = [u for c in doc["clauses"].values() for t in c["tests"] for u in t["uploads"]]
    assert any(u["kind"] == "full" and u["copied"] > 0 == u["uploaded"] for u in uploads), uploads
    assert any(u["kind"] == "incremental" and u["uploaded"] > 0 for u in uploads), uploads
    assert any(line.startswith("uploading rlt-") for line in result.outlines)
    stored = Bucket("s3://rl-bucket/deployment", store(endpoint)).identities()
    assert stored == sorted([tiny_moe.BASE_IDENTITY, *doc["provenance"]["uploaded_and_kept"]]), stored


def test_the_credentials_profile_a_setting_names_is_the_one_used(s3, monkeypatch, tmp_path, base_snapshot):
    """No key in the environment: the store is reached with the profile `rl_bucket_profile`
    names (a section of the credentials file), and without it there are no credentials at all."""
    endpoint, _ = s3
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    credentials = tmp_path / "credentials"
    credentials.write_text("[rl-run]\naws_access_key_id = rl-profile-key\naws_secret_access_key = rl-profile-secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    with pytest.raises(BucketError, match=r"could not be asked .NoCredentialsError"):
        Bucket("s3://rl-bucket", store(endpoint)).check()
    bucket = Bucket("s3://rl-bucket", store(endpoint, profile="rl-run"))
    bucket.check()
    assert bucket.put("rlt-0123abcd-abcdef-01-x", snapshot_files(base_snapshot)).files == len(
        snapshot_files(base_snapshot)
    )


@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_dry_bucket_says_what_each_write_costs_as_the_bucket_then_does(s3, base_snapshot, tmp_path, where):
    """What a plan prices (`DryBucket`) equals what the bucket then does, write by write: the
    base put whole (sent), a snapshot of one changed file beside the base (copied by the store,
    linked on this machine), a copy of it inside the bucket, and a plain upload (sent)."""
    from pytest_rlrollout.remote.bucket import DryBucket

    endpoint, _ = s3
    bucket = Bucket("s3://rl-bucket/dry", store(endpoint)) if where == "s3" else Bucket(tmp_path / "bucket")
    if where == "local":
        (tmp_path / "bucket").mkdir()
    files = snapshot_files(base_snapshot)
    changed = tmp_path / "changed" / "config.json"
    changed.parent.mkdir()
    changed.write_text((base_snapshot / "config.json").read_text() + "\n")
    dry = DryBucket(bucket)
    writes = [
        lambda b: b.put("base", files),
        lambda b: b.put(
            "one", {"config.json": changed}, same={n: f for n, f in files.items() if n != "config.json"}, source="base"
        ),
        lambda b: b.copy("one", "two"),
        lambda b: b.copy("one", "three", inner="inner"),
        lambda b: Transfer(sent=b.upload(changed.parent, "four")),
    ]
    for write in writes:
        planned = write(dry)
        done = write(bucket)
        assert (planned.sent, planned.copied, planned.linked, planned.files) == (
            done.sent,
            done.copied,
            done.linked,
            done.files,
        ), (planned, done)
    dry.put("five", {"config.json": changed})
    assert dry.exists("five") and not bucket.exists("five")  # what a plan made exists only in the plan
    dry.remove("four")
    assert bucket.exists("four")  # and a dry bucket removes nothing
