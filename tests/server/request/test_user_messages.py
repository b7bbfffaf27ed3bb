import asyncio

from memosight.server.request.user_messages import UserMessages


def test_a_failure_is_said_once_an_hour_with_the_next_answer():
    messages = UserMessages()
    messages.failure("auth", "the server refused the key")
    messages.failure("auth", "the server refused the key")  # the same kind again: not said again
    messages.failure("server", "the server failed")
    assert messages.take() == ["the server refused the key", "the server failed"] and messages.take() == []


def test_a_notice_is_said_at_once_and_counted_for_status():
    said: list[str] = []
    messages = UserMessages(say=lambda message: said.append(message) or True)

    async def scenario():
        await asyncio.to_thread(messages.notice, "unreachable", "the backend is down")  # from another thread
        await asyncio.to_thread(messages.notice, "unreachable", "the backend is down")

    asyncio.run(scenario())
    assert said == ["the backend is down"] and messages.take() == []
    assert messages.notices["unreachable"]["count"] == 2


def test_without_a_way_to_say_it_now_a_notice_waits_for_the_next_answer():
    messages = UserMessages()
    messages.notice("timeout", "the backend is slow")
    assert messages.take() == ["the backend is slow"]
    not_yet = UserMessages(say=lambda message: False)  # no client to say it to yet
    not_yet.notice("timeout", "the backend is slow")
    assert not_yet.take() == ["the backend is slow"]


def test_the_kinds_remembered_are_bounded():
    messages = UserMessages()
    for i in range(1000):
        messages.failure(f"error {i}", "x")
    assert len(messages._said) == 256
