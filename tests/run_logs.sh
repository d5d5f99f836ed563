#!/bin/sh
# adds up the last "N passed, N failed" line of each log given; prints the total
passed=0; failed=0
for log in "$@"; do
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
  if [ -z "$line" ]; then echo "$log: no summary line"; failed=$((failed + 1)); continue; fi
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
  passed=$((passed + p)); failed=$((failed + f))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
