"""The shared Redis client (gateway/runtime/redis.py) against a real
redis-server: pipelined calls each get their own reply, a script is loaded
once and again after Redis forgot it, an error reply is the one error type,
and replies split anywhere by TCP parse the same."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.config.redis import RedisConfig
from gateway.runtime.redis import (
    RedisClient,
    RedisReplyError,
    RedisScript,
    RedisUnavailable,
    _Incomplete,
    encode_command,
    parse_reply,
)
from peers.redis_server import RedisServer
from support import free_port


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


async def test_concurrent_calls_get_their_own_replies(redis: RedisServer) -> None:
    client = RedisClient(RedisConfig(redis.address, timeout=5.0))
    try:
        assert await client.call("SET", "k:0", "zero") == b"OK"
        values = [f"value-{i}".encode() * (i % 7) for i in range(200)]
        await asyncio.gather(*(client.call("SET", f"k:{i}", value) for i, value in enumerate(values)))
        got = await asyncio.gather(*(client.call("GET", f"k:{i}") for i in range(200)))
        assert got == values
        assert await client.call("GET", "missing") is None
        assert await client.call("MGET", "k:1", "missing") == [values[1], None]
        with pytest.raises(RedisReplyError, match="ERR unknown command"):
            await client.call("NO-SUCH-COMMAND")
        assert await client.call("INCRBY", "n", 5) == 5  # the connection goes on after an error reply
    finally:
        await client.close()


async def test_a_script_is_loaded_once_and_again_when_redis_forgot_it(redis: RedisServer) -> None:
    script = RedisScript("return tonumber(ARGV[1]) + #KEYS")
    client = RedisClient(RedisConfig(redis.address, timeout=5.0))
    try:
        await client.call("SCRIPT", "FLUSH")
        assert await client.evalsha(script, ("a", "b"), (40,)) == 42  # NOSCRIPT, then EVAL
        assert await client.call("SCRIPT", "EXISTS", script.sha) == [1]
        assert await client.evalsha(script, ("a",), (1,)) == 2
        await client.call("SCRIPT", "FLUSH")
        assert await client.evalsha(script, (), (7,)) == 7
    finally:
        await client.close()


@pytest.mark.parametrize("address", ["127.0.0.1:{free}", "no-such-host.invalid:6379"])
async def test_nothing_there_fails_in_time_with_the_one_error_type(address: str) -> None:
    client = RedisClient(RedisConfig(address.format(free=free_port()), timeout=0.5))
    try:
        for _ in range(3):  # refused (or not resolved), then again at once during the backoff
            with pytest.raises(RedisUnavailable):
                await asyncio.wait_for(client.call("PING"), 2.0)
    finally:
        await client.close()


def test_replies_split_anywhere_parse_the_same() -> None:
    replies = b"+OK\r\n:-12\r\n$5\r\nhe\r\nl\r\n$-1\r\n*3\r\n:1\r\n$0\r\n\r\n*-1\r\n-NOSCRIPT no\r\n"
    whole = []
    pos = 0
    while pos < len(replies):
        value, pos = parse_reply(replies, pos)
        whole.append(value)
    assert whole[:5] == [b"OK", -12, b"he\r\nl", None, [1, b"", None]]
    assert isinstance(whole[5], RedisReplyError) and str(whole[5]) == "NOSCRIPT no"
    shown = [repr(v) if not isinstance(v, RedisReplyError) else f"error {v}" for v in whole]
    for cut in range(len(replies) + 1):  # what a read ending at `cut` parses: each whole reply, then asks for more
        part, pos, got = replies[:cut], 0, []
        with pytest.raises(_Incomplete):
            while True:
                value, pos = parse_reply(part, pos)
                got.append(repr(value) if not isinstance(value, RedisReplyError) else f"error {value}")
        assert got == shown[:len(got)]
        assert len(got) == len(whole) if cut == len(replies) else len(got) < len(whole)


def test_bad_replies_are_errors_not_allocations() -> None:
    for bad in (b"?what\r\n", b"$99999999999\r\n", b"*99999999999\r\n", b":x\r\n"):
        with pytest.raises(ValueError):
            parse_reply(bad, 0)


def test_commands_are_resp_arrays() -> None:
    assert encode_command([b"SET", "k", 5, 1.5]) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n$3\r\n1.5\r\n"


def test_the_config_names_its_server() -> None:
    assert RedisConfig("[::1]:6379").host_port() == ("::1", 6379)
    assert RedisConfig("redis.internal:6380").host_port() == ("redis.internal", 6380)
