"""Evaluation by lm-evaluation-harness's conventions: perplexity (rolling windows), multiple
choice (acc, acc_norm), generation (stop strings, answer extraction, exact match) and code
(pass@k through the sandboxed python_tests verifier).

    spec.py          task YAML -> TaskSpec; Doc, one item
    formats.py       readers of the public formats (HellaSwag, ARC, MMLU, GSM8K, HumanEval, MBPP)
    requests.py      items -> token requests (few-shot contexts, _encode_pair, rolling windows)
    loglik.py        batched log-likelihoods, each context computed once per item
    evaluate.py      one process's evaluation of a list of items (a Ray worker, or a train rank)
    metrics.py       per-item records -> metrics, with formulas
    contamination.py 13-gram overlap with a run's training data cache
    in_training.py   the `eval.tasks` hook on the live (FSDP) model

The Ray driver (sharding, resumption, reward service for code) is elastic/launch/eval.py.
"""
