// Four goroutines on two threads (GOMAXPROCS=2) computing longer than Go's 10 ms time
// slice: the runtime preempts them asynchronously with SIGURG, whose handler rewrites the
// saved context to resume in asyncPreempt, which returns to the interrupted instruction.
package main

import (
	"fmt"
	"sync"
)

func fib(n int) int {
	if n < 2 {
		return n
	}
	return fib(n-1) + fib(n-2)
}

func spin(n int) int {
	s := 0
	for i := 0; i < n; i++ {
		if i%3 == 0 {
			s += i
		} else {
			s ^= i
		}
	}
	return s
}

func main() {
	var wg sync.WaitGroup
	res := make([]int, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			res[g] = fib(22) + spin(1500000)
		}(g)
	}
	wg.Wait()
	fmt.Println(res[0], res[1], res[2], res[3])
}
