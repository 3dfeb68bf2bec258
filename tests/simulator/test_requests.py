"""The requests a simulated RL step sends (`simulator.requests`): whole blocks from the prefix cache, never a prompt's
last token; a prompt's samples sent together prefill it once."""

from specrl_openrlhf.simulator.corpus import Corpus
from specrl_openrlhf.simulator.requests import BLOCK_TOKENS, Request, Samples, cached_tokens, samples_of


def test_the_prefix_cache_serves_whole_blocks_short_of_the_last_token():
    assert BLOCK_TOKENS == 16
    assert [cached_tokens(shared, 40) for shared in (0, 15, 16, 40)] == [0, 0, 16, 32]
    assert cached_tokens(32, 32) == 16  # a prompt of two whole blocks computes its last token: one block is read


def test_a_prompts_first_sample_prefills_it_and_its_siblings_read_its_blocks():
    first, second = samples_of("e0-p3", 3, list(range(40)), [[7], [8]])
    assert (first.id, first.cached, first.prefilled) == ("e0-p3-s0", 0, 0)
    assert (second.id, second.cached, second.prefilled, second.to_prefill) == ("e0-p3-s1", 32, 32, 40)
    requests = Samples().requests(0, [0], Corpus([[1, 2, 3]], [[[[5], [6]]]]))
    assert [r.response for r in requests] == [[5], [6]] and Samples().followups(requests[0]) == []


def test_a_preempted_request_prefills_its_prompt_and_what_it_had_taken_again():
    request = Request("r", 0, [1, 2, 3], [4, 5, 6], prefilled=3, taken=2)
    assert request.context == 5 and not request.finished
    request.preempt()
    assert (request.to_prefill, request.prefilled, request.context) == (5, 0, 0)
