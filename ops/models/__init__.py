"""The tiny offline models the tests and benches run: the model builder, the families'
public chat templates and the tokenizer's training corpus."""
