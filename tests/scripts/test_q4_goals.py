"""The 4-bit goals are computed from per-prompt ratios, and each goal says met or missed from its figure."""

import q4_goals as q


def _report(tps: dict[str, tuple[float, float]], step_over_bound=2.0) -> dict:
    records = [{"set": "s", "prompt_id": f"p{i}", "method": m, "tokens_per_s": v[i], "token_ids": [1, 2, 3 + (m == q.LLAMA)]}
               for m, v in tps.items() for i in range(2)]
    return {"records": records, "memory_bound": {"q4": {"step_over_bound": step_over_bound}}}


def test_ratios_are_geometric_means_of_per_prompt_ratios_and_goals_follow_them():
    report = _report({q.AR32: (10, 40), q.AR4: (40, 90), q.HS4: (50, 100), q.LLAMA: (25, 200),
                      q.LLAMA_LOOKUP: (20, 50)})
    r = q.ratios(report)
    assert r["q4_ar_over_fp32_ar"] == 3.0  # sqrt(4 * 2.25): not the ratio of medians (65 / 25 = 2.6)
    assert r["q4_hispec_over_llamacpp"] == round((2 * 0.5) ** 0.5, 3)
    assert r["q4_hispec_over_llamacpp_lookup"] == round((2.5 * 2) ** 0.5, 3)
    met = {name: ok for name, _, ok in q.goals(r)}
    assert met == {"q4 autoregressive >= 3x fp32 autoregressive": True, "q4 autoregressive >= llama.cpp plain": False,
                   "hispec(auto) q4 >= 1.3x llama.cpp plain": False, "hispec(auto) q4 >= llama.cpp with its lookup": True,
                   "q4 plain step within 2x of the memory bound": True}
    assert q.goals(q.ratios(_report({q.AR32: (10, 10)})))[0][2] is None  # not measured: neither met nor missed
    # two lookups measured: the goal takes the faster one over llama.cpp's plain decoding, and names it
    two = q.ratios(_report({q.HS4: (50, 100), q.LLAMA: (25, 200), q.LLAMA_LOOKUP: (20, 50),
                            q.LLAMA_LOOKUP + ":2": (40, 150)}))
    assert two["llamacpp_lookup_best"] == "llamacpp_lookup:2"
    assert two["q4_hispec_over_llamacpp_lookup"] == round((50 / 40 * 100 / 150) ** 0.5, 3)
    assert "(its fastest here, llamacpp_lookup:2)" in q.goals(two)[3][0]
    no_lookup = {name: ok for name, _, ok in q.goals(q.ratios(_report({q.HS4: (1, 1), q.LLAMA: (1, 1)})))}
    assert no_lookup["hispec(auto) q4 >= llama.cpp with its lookup"] is None  # the peer did not run


def test_first_difference_is_none_only_for_equal_outputs():
    assert q.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert q.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert q.first_difference([1, 2], [1, 2, 3]) == 2
    rows = q.divergence(_report({q.AR32: (1, 1), q.AR4: (1, 1), q.LLAMA: (1, 1)}))
    assert [(r["q4_vs_fp32"], r["llamacpp_vs_q4"]) for r in rows] == [(None, 2), (None, 2)]
