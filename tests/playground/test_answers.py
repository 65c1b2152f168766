"""An answer that meets a UserError ends its side with an error message (its code, or `refused`)."""
from __future__ import annotations

from lanner.backend.playground.answers import REFUSED, Answers
from lanner.backend.schemas.playground import GenerateRequest
from lanner.core.errors import UserError


class RefusingCache:
    def __init__(self, error: UserError):
        self.error = error

    def loaded(self) -> list:
        return []

    def use(self, path):
        raise self.error


def test_a_user_error_ends_the_side_with_its_code_or_refused():
    request = GenerateRequest(type="generate", id=7, job_id=1, chats={"tuned": [{"role": "user", "content": "Hi"}]})
    for error, code in ((UserError(422, "too long", code="context_full"), "context_full"),
                        (UserError(409, "not readable"), REFUSED)):
        sent: list[dict] = []
        answers = Answers(request, sent.append)
        answers._answer(RefusingCache(error), "tuned", "model.gguf", None)
        assert sent[-1] == {"type": "error", "code": code, "message": error.message, "model": "tuned", "id": 7}
        assert not answers.running()
