"""TEST DOUBLES of the inference server: a scripted vLLM that speaks its wire format with a real tokenizer
and chat template, for tests and the demo where a real model cannot run."""
