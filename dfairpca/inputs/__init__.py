"""What the estimators are given: X checked and flattened, protected attributes encoded."""
