"""The playground's model cache on real llama.cpp loads of the SmolLM2 GGUF: a memory bound with
least-recently-used eviction, models in use never evicted, and one load for concurrent users."""
from __future__ import annotations

import shutil
import threading

import pytest

from lanner.core.errors import UserError
from lanner.inference.cache import NOT_ENOUGH_MEMORY, ModelCache
from lanner.inference.generation import estimate_bytes, load_llama

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """Three GGUF files (copies of the shipped SmolLM2: three models as far as the cache knows)."""
    from lanner.core.default_model import gguf_path

    folder = tmp_path_factory.mktemp("ggufs")
    return [shutil.copyfile(gguf_path(), folder / f"model-{name}.gguf") for name in "abc"]


def test_the_estimate_counts_the_weights_and_the_kv_cache(ggufs):
    size = ggufs[0].stat().st_size
    estimate = estimate_bytes(ggufs[0])
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; f16 K and V for 4096 tokens = 94 MB.
    assert estimate - size >= 2 * 30 * 4096 * 3 * 64 * 2


def test_the_least_recently_used_idle_model_makes_room(ggufs):
    a, b, c = ggufs
    one = estimate_bytes(a)
    cache = ModelCache(int(one * 2.5), load_llama, estimate_bytes)
    with cache.use(a) as entry:
        assert entry.model.n_ctx() > 0
    with cache.use(b):
        pass
    with cache.use(a):  # a is now the most recently used
        pass
    assert cache.loads == 2 and cache.loaded() == [b, a]
    with cache.use(c):
        pass
    assert cache.loaded() == [a, c]  # b went, a stayed
    assert cache.loads == 3 and cache.used_bytes() <= cache.capacity_bytes
    with cache.use(b):  # back again: loaded again, a (least recent now) goes
        pass
    assert cache.loaded() == [c, b] and cache.loads == 4
    cache.clear()
    assert cache.loaded() == [] and cache.used_bytes() == 0


def test_a_model_in_use_is_never_evicted_and_the_refusal_says_why(ggufs):
    a, b, c = ggufs
    cache = ModelCache(int(estimate_bytes(a) * 2.5), load_llama, estimate_bytes)
    with cache.use(a), cache.use(b):
        with pytest.raises(UserError, match="2 other model\\(s\\) are answering other people") as refused:
            with cache.use(c):
                pass
        assert refused.value.code == NOT_ENOUGH_MEMORY
        assert cache.loaded() == [a, b]
    assert cache.loads == 2
    with cache.use(c):  # once they are idle, the least recently used makes room
        pass
    assert cache.loaded() == [b, c]

    small = ModelCache(estimate_bytes(a) // 2, load_llama, estimate_bytes)
    with pytest.raises(UserError, match="LANNER_PLAYGROUND_CACHE_BYTES") as refused:
        with small.use(a):
            pass
    assert refused.value.code == NOT_ENOUGH_MEMORY
    assert small.loads == 0 and small.used_bytes() == 0
    cache.clear()


def test_concurrent_users_of_one_model_load_it_once(ggufs):
    cache = ModelCache(10 * estimate_bytes(ggufs[0]), load_llama, estimate_bytes)
    start = threading.Barrier(4)
    models, errors = [], []

    def chat():
        try:
            start.wait()
            with cache.use(ggufs[0]) as entry:
                models.append(entry.model)
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=chat) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert cache.loads == 1 and len(models) == 4 and len({id(model) for model in models}) == 1
    cache.clear()


def test_a_model_streams_several_answers_from_a_bounded_pool_of_contexts_on_one_copy(ggufs):
    from lanner.inference.generation import Sampling, add_context, context_bytes, stream_answer

    a, b = ggufs[:2]
    one, extra = estimate_bytes(a), context_bytes(a)
    cache = ModelCache(one + extra, load_llama, estimate_bytes, add_context=add_context, context_bytes=context_bytes,
                       contexts_per_model=3)
    waited = []
    with cache.use(a) as entry:
        with cache.context(entry) as first, cache.context(entry) as second:
            assert first is entry.model and second is not first
            assert second._model is first._model and second.ctx != first.ctx  # same weights, own KV cache
            assert cache.used_bytes() == one + extra and cache.loads == 1
            # Two answers advanced a token at a time, turn about: each keeps its own place.
            prompt = "<|im_start|>user\nCount from 1 to 20.<|im_end|>\n<|im_start|>assistant\n"
            greedy = Sampling(temperature=0, max_tokens=12)
            streams = [stream_answer(llama, prompt, greedy, lambda: False) for llama in (first, second)]
            texts = ["", ""]
            for _ in range(12):
                for index, stream in enumerate(streams):
                    piece = next(stream, {})
                    texts[index] += piece.get("text", "")
            assert texts[0] and texts[0] == texts[1]
            # A third would need a third KV cache the bound has no room for: it waits for a context.
            with cache.context(entry, waiting=lambda: waited.append(True), stopped=lambda: bool(waited)) as third:
                assert third is None and waited == [True]
        with cache.context(entry) as again:  # freed contexts are reused, not made again
            assert again in (first, second) and cache.contexts(a) == 2
    with cache.use(b):  # the idle model and both its contexts make room
        assert cache.loaded() == [b] and cache.used_bytes() == one
    cache.clear()
