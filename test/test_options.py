"""Command-line values (:mod:`indexer_topk.options`): token counts and comma lists."""

import pytest

from indexer_topk import options


@pytest.mark.parametrize(
    "text, tokens",
    [("65536", 65536), ("64K", 65536), ("768k", 786432), ("1M", 1048576), (" 256K ", 262144)],
)
def test_parse_tokens(text, tokens):
    assert options.parse_tokens(text) == tokens
    assert options.parse_tokens(options.format_tokens(tokens)) == tokens


@pytest.mark.parametrize("text", ["", "12X", "1.5M", "-4K", "0", "8589934589", "8193M", "99999999999999M"])
def test_parse_tokens_rejects(text):
    """Not a count, not positive, or past what int32 C4 positions index (no allocation is tried)."""
    with pytest.raises(ValueError):
        options.parse_tokens(text)


def test_parse_tokens_takes_the_largest_count_int32_positions_index():
    assert options.parse_tokens(str(options.MAX_TOKENS)) == options.MAX_TOKENS == 4 * (2**31 - 1)


def test_parse_list_names_the_option():
    assert options.parse_list("1,2, 3", int, name="--rows") == [1, 2, 3]
    with pytest.raises(ValueError, match="--rows"):
        options.parse_list("1,x", int, name="--rows")



def test_one_of_accepts_only_the_choices():
    assert options.parse_list("legacy,fused", options.one_of(("legacy", "fused", "aiter"))) == ["legacy", "fused"]
    with pytest.raises(ValueError, match="--backends: unknown value 'warp'"):
        options.parse_list("legacy,warp", options.one_of(("legacy", "fused")), name="--backends")
    with pytest.raises(ValueError, match="--layouts: empty list"):
        options.parse_list(" , ", name="--layouts")


@pytest.mark.parametrize("text, seed", [("0", 0), (" 7 ", 7), (str(2**64 - 1), 2**64 - 1), (5, 5)])
def test_parse_seed(text, seed):
    assert options.parse_seed(text) == seed


@pytest.mark.parametrize("text", ["", "-1", str(2**64), "1e3", "0x10", "seven", "1.0", None])
def test_parse_seed_rejects(text):
    with pytest.raises(ValueError, match="2\\*\\*64"):
        options.parse_seed(text)
