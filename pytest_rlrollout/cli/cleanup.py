"""`rlrollout cleanup`: remove from a bucket the snapshots conformance runs left there (a run
killed before its end removes nothing). Only names a run gives its snapshots
(`rlt-<run>-<test>-<n>-<label>`) are touched; `--dry-run` lists them and removes nothing."""

from __future__ import annotations

import argparse

from pytest_rlrollout.cli.exits import EXIT_OK, UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("cleanup", help="remove the snapshots conformance runs left in a bucket (rlt-*)")
    c.add_argument(
        "--rl-bucket-url",
        required=True,
        dest="bucket",
        metavar="URL",
        help="the bucket: a directory, file://, s3:// or gs://",
    )
    c.add_argument(
        "--run", dest="run_id", help="only the snapshots of this run (its 8-character id, in every identity it made)"
    )
    c.add_argument(
        "--keep", nargs="+", default=[], metavar="IDENTITY", help="leave these (a deployment may still serve them)"
    )
    c.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    c.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pytest_rlrollout.remote.bucket import Bucket
    from pytest_rlrollout.runs.snapshots import left_behind

    if args.run_id is not None and not (len(args.run_id) == 8 and all(c in "0123456789abcdef" for c in args.run_id)):
        raise UsageError(f"--run {args.run_id!r}: a run id is 8 lowercase hex digits (as in rlt-<run>-...)")
    try:
        bucket = Bucket(args.bucket)
    except ValueError as e:
        raise UsageError(str(e)) from None
    left = [i for i in left_behind(bucket, args.run_id) if i not in args.keep]
    verb = "would remove" if args.dry_run else "removed"
    total = 0
    for identity in left:
        size = bucket.tree_size(identity)
        if not args.dry_run:
            bucket.remove(identity)
        total += size
        print(f"{verb} {identity} ({size:,} bytes)")
    kept = [i for i in args.keep if bucket.exists(i)]
    print(
        f"{verb} {len(left)} snapshot(s), {total:,} bytes, from {bucket.url}"
        + (f"; kept {', '.join(kept)}" if kept else "")
    )
    return EXIT_OK
