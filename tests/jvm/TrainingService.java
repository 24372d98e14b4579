// A small JVM service for the training tests: an HTTP server whose requests run on a named pool
// ("req-handler-N", each request hashes and allocates a little, so the collector runs too) and,
// in the same process, a CPU-heavy background thread ("report-builder") that computes in 20 ms
// stretches with 2 ms sleeps whatever the load. Usage: java TrainingService.java PORT THREADS
import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.security.MessageDigest;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;

public class TrainingService {
    static volatile long sink;

    static byte[] work(int rounds, int allocate) throws Exception {
        MessageDigest digest = MessageDigest.getInstance("SHA-256");
        byte[] data = new byte[allocate];
        for (int i = 0; i < rounds; i++) {
            data[i % allocate] = (byte) i;
            data = digest.digest(data).length > 0 ? data : data;
        }
        return digest.digest(data);
    }

    public static void main(String[] args) throws Exception {
        int port = Integer.parseInt(args[0]);
        int threads = Integer.parseInt(args[1]);
        AtomicInteger number = new AtomicInteger();
        ExecutorService pool = Executors.newFixedThreadPool(threads, task -> {
            Thread t = new Thread(task, "req-handler-" + number.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        Thread background = new Thread(() -> {
            try {
                while (true) {
                    long until = System.nanoTime() + 20_000_000L;
                    while (System.nanoTime() < until) {
                        sink += work(50, 64)[0];
                    }
                    Thread.sleep(2);
                }
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        }, "report-builder");
        background.setDaemon(true);
        background.start();
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 128);
        server.createContext("/", exchange -> {
            try {
                byte[] body = work(40, 16 * 1024);
                exchange.sendResponseHeaders(200, body.length);
                try (OutputStream out = exchange.getResponseBody()) {
                    out.write(body);
                }
            } catch (Exception e) {
                exchange.sendResponseHeaders(500, -1);
            } finally {
                exchange.close();
            }
        });
        server.setExecutor(pool);
        server.start();
        System.out.println("listening " + port);
    }
}
