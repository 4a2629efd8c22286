"""The speculative methods' capabilities, from the contract both sides share
(serving/contract/methods.py, stdlib only). Nothing in ddops compares a method's name:
render, gate and preflight read the capabilities."""

from serving.contract.methods import METHODS, Method, method_for, method_key, reported_algorithm

__all__ = ["METHODS", "Method", "method_for", "method_key", "reported_algorithm"]
