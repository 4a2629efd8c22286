"""`make sglang-argparse`'s pure parts (ddops/lab/sglang_argparse.py): which shipped profiles it
puts to a release's parser, and what of a `+ddtree` profile the release is asked to take. The
parser itself is SGLang 0.5.23's, run by that cached command (2.3 GB venv, not in make test);
0.5.15's is run by tests/deploy/test_lab_sglang.py on a lab host's install."""

from ddops.lab.sglang_argparse import checks, profile_argvs, released_argv


def test_the_shipped_0_5_23_profiles_are_put_to_the_release_without_the_ddtree_prs_words():
    argvs = profile_argvs("0.5.23", "/tmp/key.yaml")
    assert sorted(argvs) == ["a6000-balanced", "a6000-base", "a6000-shadow", "a6000-shadow-small",
                             "a6000-shadow-small-nograph"]
    base = argvs["a6000-base"]
    assert "--speculative-ddtree-budget" not in base and "DDTREE" not in base
    assert base[base.index("--speculative-algorithm") + 1] == "DFLASH"
    assert base[base.index("--config") + 1] == "/tmp/key.yaml" and base[:2] == ["--model-path", base[1]]
    assert profile_argvs("0.5.19", "/tmp/key.yaml") == {}


def test_a_release_profile_keeps_every_word():
    argv = ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "32", "--tp-size", "2"]
    assert released_argv(argv, pr=False) == argv
    assert released_argv(argv, pr=True) == ["--speculative-algorithm", "DFLASH", "--tp-size", "2"]


def test_a_table_fact_the_parser_contradicts_fails_its_check():
    seen = {"options": ["--cuda-graph-max-bs-decode"], "kv_cache_dtypes": ["auto"],
            "knows": {a: a != "DDTREE" for a in ("DFLASH", "DSPARK", "EAGLE", "EAGLE3", "NEXTN", "NGRAM",
                                                 "STANDALONE", "UNO", "DDTREE")},
            "argv": {"a6000-base": {"ok": True}, "removed --cuda-graph-max-bs": {"ok": True}}}
    failed = {row["check"] for row in checks("0.5.23", seen) if not row["ok"]}
    assert "removed --cuda-graph-max-bs: refused" in failed                   # the release still took it
    assert "--speculative-draft-kv-cache-dtype exists (added by 0.5.23 or earlier)" in failed
    assert "KV cache dtypes are the parser's choices" in failed
    assert "profile a6000-base parses" not in failed
