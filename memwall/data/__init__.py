"""Data files shipped with memwall: eval_text.txt, the text chapters score perplexity on (written for the project)."""
