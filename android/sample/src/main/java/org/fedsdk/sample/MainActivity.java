package org.fedsdk.sample;

import android.app.Activity;
import android.os.Bundle;
import android.widget.Button;
import android.widget.EditText;
import android.widget.LinearLayout;
import android.widget.TextView;
import org.fedsdk.android.FedsdkApp;
import org.fedsdk.android.FedsdkWorker;
import org.fedsdk.device.FedsdkDevice;

/** One screen: server, CA pin, code, a Pair button, and the result. */
public final class MainActivity extends Activity {
    @Override
    protected void onCreate(Bundle state) {
        super.onCreate(state);
        LinearLayout layout = new LinearLayout(this);
        layout.setOrientation(LinearLayout.VERTICAL);
        EditText server = new EditText(this);
        server.setHint("mqtts://host:8883");
        EditText pin = new EditText(this);
        pin.setHint("sha256:...");
        EditText code = new EditText(this);
        code.setHint("XXXX-XXXX");
        Button pair = new Button(this);
        pair.setText("Pair");
        TextView status = new TextView(this);
        layout.addView(server);
        layout.addView(pin);
        layout.addView(code);
        layout.addView(pair);
        layout.addView(status);
        setContentView(layout);
        pair.setOnClickListener(v -> new Thread(() -> {
            getSharedPreferences("fedsdk", MODE_PRIVATE).edit().putString("server", server.getText().toString()).apply();
            FedsdkApp app = (FedsdkApp) getApplication();
            int[] shape = app.fedsdkInputShape();
            String text;
            try (FedsdkDevice device = FedsdkDevice.builder().server(server.getText().toString())
                    .caFingerprint(pin.getText().toString()).pairCode(code.getText().toString(), android.os.Build.MODEL)
                    .workDir(FedsdkWorker.workDir(this).toPath()).dataProvider(app.fedsdkData(), shape[0], shape[1], shape[2])
                    .build()) {
                device.pair(120);
                FedsdkWorker.schedule(this, 60);
                text = "paired: " + device.status();
            } catch (RuntimeException e) {
                text = "pairing failed: " + e.getMessage();
            }
            String shown = text;
            runOnUiThread(() -> status.setText(shown));
        }).start());
    }
}
