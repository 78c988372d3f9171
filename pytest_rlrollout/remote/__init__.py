"""Talking to a deployment under test: the client and its parsed streams, the SSE decoder, record
and replay (cassettes), the bucket snapshots are uploaded to, and the cross-process lock."""
