"""Stage 3: metrics, confidence intervals over seeds, paper-layout tables and plots."""
