import com.caucho.hessian.io.Hessian2Input;
import com.caucho.hessian.io.Hessian2Output;
import com.example.inventory.DeductReply;
import com.example.inventory.DeductRequest;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.lang.reflect.Array;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.dubbo.rpc.service.GenericException;

/**
 * Reads and writes Dubbo 2 bodies with Caucho Hessian, in the order of
 * Java Dubbo's DubboCodec, DecodeableRpcInvocation and DecodeableRpcResult:
 * strings with readString/writeString (Dubbo's readUTF/writeUTF), the result
 * flag with readInt/writeInt (Dubbo's readByte/writeByte), values and the
 * attachments map with readObject/writeObject. A request's arguments are
 * read by the classes of its descriptor (String[] and Object[] for
 * $invoke); a $invoke's arguments are then made values of the types it
 * names, a POJO's map an object of its class, as a provider's generic
 * filter makes them.
 *
 * java Peer (request FILE | response FILE | error FILE | write DIR)...
 */
public class Peer {
    public static void main(String[] args) throws Exception {
        // Pairs of mode and file, so that one JVM reads many bodies; each
        // body's lines follow a line "== FILE".
        for (int i = 0; i + 1 < args.length; i += 2) {
            System.out.println("== " + Path.of(args[i + 1]).getFileName());
            switch (args[i]) {
                case "request" -> request(Files.readAllBytes(Path.of(args[i + 1])));
                case "response" -> response(Files.readAllBytes(Path.of(args[i + 1])));
                case "error" -> System.out.println("error " + input(Files.readAllBytes(Path.of(args[i + 1]))).readString());
                case "write" -> write(Path.of(args[i + 1]));
                default -> throw new IllegalArgumentException("unknown mode " + args[i]);
            }
        }
    }

    static Hessian2Input input(byte[] body) {
        return new Hessian2Input(new ByteArrayInputStream(body));
    }

    /** Parameter classes of a JVM descriptor, as ReflectUtils.desc2classArray gives them. */
    static List<Class<?>> types(String desc) throws ClassNotFoundException {
        List<Class<?>> out = new ArrayList<>();
        for (int i = 0; i < desc.length(); ) {
            int start = i;
            while (desc.charAt(i) == '[') i++;
            char c = desc.charAt(i);
            int end = c == 'L' ? desc.indexOf(';', i) + 1 : i + 1;
            String d = desc.substring(start, end);
            i = end;
            switch (d) {
                case "Z" -> out.add(boolean.class);
                case "I" -> out.add(int.class);
                case "J" -> out.add(long.class);
                case "D" -> out.add(double.class);
                default -> out.add(d.startsWith("[")
                        ? Class.forName(d.replace('/', '.'))
                        : Class.forName(d.substring(1, d.length() - 1).replace('/', '.')));
            }
        }
        return out;
    }

    static void request(byte[] body) throws Exception {
        Hessian2Input in = input(body);
        String dubbo = in.readString(), path = in.readString(), version = in.readString();
        String method = in.readString(), desc = in.readString();
        System.out.println("request dubbo=" + dubbo + " path=" + path + " version=" + version
                + " method=" + method + " types=" + desc);
        List<Object> args = new ArrayList<>();
        for (Class<?> t : types(desc)) {
            Object arg = in.readObject(t);
            if (arg != null && !t.isPrimitive() && !t.isInstance(arg)) {
                throw new IOException("argument " + describe(arg) + " is no " + t.getName());
            }
            System.out.println("arg " + describe(arg));
            args.add(arg);
        }
        System.out.println("attachments " + sorted(in.readObject(Map.class)));
        if (method.equals("$invoke")) {
            // What a provider's generic filter then does: each argument
            // made a value of its named type, a POJO's map an object of
            // the class it names.
            String[] names = (String[]) args.get(1);
            Object[] values = (Object[]) args.get(2);
            if (names.length != values.length) {
                throw new IOException(names.length + " types for " + values.length + " arguments");
            }
            for (int i = 0; i < names.length; i++) {
                System.out.println("realized " + describe(realize(values[i], names[i])));
            }
        }
    }

    /** v as a value of the Java type named name, as Dubbo's PojoUtils.realize makes it, for the types used here. */
    static Object realize(Object v, String name) throws Exception {
        switch (name) {
            case "long": return ((Number) v).longValue();
            case "int": return ((Number) v).intValue();
            case "boolean": return (Boolean) v;
            case "double": return ((Number) v).doubleValue();
            default: break;
        }
        Class<?> type = Class.forName(name);
        if (!(v instanceof Map<?, ?> m)) {
            return type.cast(v);
        }
        Class<?> cls = m.containsKey("class") ? Class.forName((String) m.get("class")) : type;
        if (!type.isAssignableFrom(cls)) {
            throw new IOException("class " + cls.getName() + " is no " + name);
        }
        Object pojo = cls.getDeclaredConstructor().newInstance();
        for (Map.Entry<?, ?> e : m.entrySet()) {
            if (e.getKey().equals("class")) continue;
            java.lang.reflect.Field f = cls.getDeclaredField((String) e.getKey());
            f.setAccessible(true);
            f.set(pojo, realize(e.getValue(), f.getType().getName()));
        }
        return pojo;
    }

    static void response(byte[] body) throws Exception {
        Hessian2Input in = input(body);
        int flag = in.readInt();
        System.out.println("response flag=" + flag);
        switch (flag % 3) {
            case 0 -> {
                Object e = in.readObject();
                if (!(e instanceof Throwable)) throw new IOException("not a Throwable: " + e);
                System.out.println("exception " + e.getClass().getName() + " " + ((Throwable) e).getMessage());
                if (e instanceof GenericException g) {
                    System.out.println("wrapped " + g.getExceptionClass() + " " + g.getExceptionMessage());
                }
                // What a Java consumer does with it: the trace must print.
                ((Throwable) e).printStackTrace(new java.io.PrintStream(new ByteArrayOutputStream()));
            }
            case 1 -> {
                Object v = in.readObject();
                System.out.println("value " + v.getClass().getName() + " " + v);
            }
            default -> {}
        }
        if (flag >= 3) {
            System.out.println("attachments " + sorted(in.readObject(Map.class)));
        }
    }

    /**
     * A value as its class and text; arrays, lists and maps element by
     * element, a map's entries sorted by key, so that the text is the same
     * from one run to the next.
     */
    static String describe(Object v) {
        if (v == null) return "null";
        if (v.getClass().isArray()) {
            List<String> parts = new ArrayList<>();
            for (int i = 0; i < Array.getLength(v); i++) parts.add(describe(Array.get(v, i)));
            return v.getClass().getComponentType().getName() + "[] " + parts;
        }
        if (v instanceof List<?> l) {
            List<String> parts = new ArrayList<>();
            for (Object x : l) parts.add(describe(x));
            return v.getClass().getName() + " " + parts;
        }
        if (v instanceof Map<?, ?> m) {
            Map<String, String> parts = new TreeMap<>();
            m.forEach((k, x) -> parts.put(String.valueOf(k), describe(x)));
            return v.getClass().getName() + " " + parts;
        }
        return v.getClass().getName() + " " + v;
    }

    static String sorted(Object m) {
        return new TreeMap<>((Map<?, ?>) m).toString();
    }

    static void write(Path dir) throws IOException {
        Map<String, Object> att = new HashMap<>();
        att.put("timeout", "1500");
        att.put("interface", "com.example.inventory.InventoryService");
        att.put("path", "com.example.inventory.InventoryService");
        body(dir.resolve("request_deduct_once.bin"), out -> {
            out.writeString("2.0.2");
            out.writeString("com.example.inventory.InventoryService");
            out.writeString("1.0.0");
            out.writeString("deductOnce");
            out.writeString("Lcom/example/inventory/DeductRequest;");
            out.writeObject(new DeductRequest("10086", 5, "java-1"));
            out.writeObject(att);
        });
        body(dir.resolve("request_deduct.bin"), out -> {
            out.writeString("2.0.2");
            out.writeString("com.example.inventory.InventoryService");
            out.writeString(null);
            out.writeString("deduct");
            out.writeString("JI");
            out.writeObject(10086L);
            out.writeObject(4);
            out.writeObject(att);
        });
        Map<String, Object> ratt = new HashMap<>();
        ratt.put("dubbo", "2.0.2");
        body(dir.resolve("response_pojo.bin"), out -> {
            out.writeInt(4);
            out.writeObject(new DeductReply(999995L, false));
            out.writeObject(ratt);
        });
        body(dir.resolve("response_exception.bin"), out -> {
            out.writeInt(3);
            out.writeObject(new IllegalArgumentException("count must be positive: 0"));
            out.writeObject(ratt);
        });
        body(dir.resolve("response_generic_exception.bin"), out -> {
            out.writeInt(3);
            out.writeObject(new GenericException("java.lang.RuntimeException", "unknown sku 7"));
            out.writeObject(ratt);
        });
        body(dir.resolve("response_null.bin"), out -> out.writeInt(2));
    }

    interface Writer {
        void write(Hessian2Output out) throws IOException;
    }

    static void body(Path file, Writer w) throws IOException {
        ByteArrayOutputStream b = new ByteArrayOutputStream();
        Hessian2Output out = new Hessian2Output(b);
        w.write(out);
        out.flushBuffer();
        Files.write(file, b.toByteArray());
    }
}
